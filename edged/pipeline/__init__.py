"""Stage 3, one pipeline: frames from its source enter, numbered result messages leave for the store.

`runner.PipelineRunner` owns a pipeline's runtime (source, model, inference workers, publish filter,
snapshots) and is what the daemon and reload talk to; `worker` runs frames through the model, `publish`
decides which results leave, `snapshots` writes pictures, `message` builds the result message.
"""
