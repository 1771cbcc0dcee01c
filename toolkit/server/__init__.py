"""`ttsq serve`: an OpenAI-compatible speech server (FastAPI on uvicorn) over toolkit.scheduler's continuous
batching. The top layer: nothing in the library imports it. Needs the `serve` extra (`ray_app` the `ray` extra)."""
