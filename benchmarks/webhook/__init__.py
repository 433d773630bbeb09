"""The webhook's HTTP benchmark: gpupack's POST /mutate against bare starlette + uvicorn."""
