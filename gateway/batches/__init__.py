"""`/v1/files` and `/v1/batches`: batches run by the gateway itself through its own pipeline, or
relayed to an upstream that runs them (`native`)."""
