"""Run every benchmark in this folder in turn (`./dev bench`); each prints its own table with its targets."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    status = 0
    for name in ("bench_core.py", "bench_batch.py", "bench_docker.py", "bench_ray.py"):
        print(f"== {name}", flush=True)
        status |= subprocess.call([sys.executable, os.path.join(HERE, name)])
    sys.exit(status)
