"""The bundled worker pool: local inference servers run and balanced as one provider.

    settings.py   the pool's fields in llms.json
    gpus.py       GPU discovery (NVML, nvidia-smi) and tensor-parallel groups
    sources.py    model weights: a path, a Hugging Face id, or a package that ships them
    engines.py    vLLM or llama.cpp, and each worker's exact command line (pure)
    reaper.py     runs a worker so it never outlives the gateway
    process.py    a spawned worker process: start, forward output, stop
    worker.py     a worker's state machine and load
    scrape.py     vLLM /metrics → load figures (pure)
    picking.py    prefix affinity unless overloaded, else least loaded (pure)
    pool.py       supervision, health checks, restarts, draining, picking
    setup.py      settings → a started pool
    provider.py   the `pool` provider kind the router sees
"""
