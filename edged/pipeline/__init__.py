"""Stage 3, one pipeline: frames from its source enter, numbered result messages leave for the store.

`runner.PipelineRunner` owns a pipeline's runtime (source, model, inference workers, result filter,
snapshots) and is what the daemon and reload talk to; `worker` runs frames through the model (`model` loads
it with its pre- and postprocessing, `secondary` runs a second model on the first one's boxes),
`resultfilter` decides which results leave, `tracking` and `scene` follow objects and zones across frames,
`frametap` hands frames to the recorder, `snapshots` writes pictures, `message` builds the result message.
"""
