package events

// SchemaLockSQL exposes the schema lock statement to the tests.
const SchemaLockSQL = schemaLockSQL
