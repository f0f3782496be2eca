// Aedes (npm), the MQTT broker the tests run as a third implementation: in memory, as its defaults are.
// Usage: node aedes.mjs PORT   (NODE_PATH is not read for ES modules: run it from .brokers/aedes or set
// the import path through the AEDES environment variable, as tests/brokers.py does)
const port = Number(process.argv[2])
const { Aedes } = await import(process.env.AEDES ?? 'aedes')
const { createServer } = await import('node:net')
const broker = await Aedes.createBroker()
const server = createServer(broker.handle)
server.listen(port, '127.0.0.1', () => console.log(`aedes ${broker.id} listening on 127.0.0.1:${port}`))
