"""What an S3 client's service models cost the operator's memory, by how botocore's JSON files are decoded
(prints figures; nothing is asserted).

- botocore: its own loader (JSONFileLoader decodes into OrderedDicts);
- plain: speculator_operator's PlainJSONFileLoader (plain dicts), through botocore's public Loader.

Each is measured in a fresh interpreter: the Python memory traced (tracemalloc) and the resident set grown by
making one S3 client, after a garbage collection. Run: hack/bench botocore_models
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

MEASURE = """
import gc, json, sys, tracemalloc
from pathlib import Path

def rss():
    return next(int(l.split()[1]) * 1024 for l in Path("/proc/self/status").read_text().splitlines()
                if l.startswith("VmRSS:"))

import boto3, botocore.session
from speculator_operator.adapters import sources
gc.collect()
before_rss = rss()
tracemalloc.start()
if sys.argv[1] == "plain":
    session = sources.botocore_session()
else:
    session = botocore.session.Session()
client = boto3.session.Session(botocore_session=session).client(
    "s3", endpoint_url="http://127.0.0.1:9", aws_access_key_id="a", aws_secret_access_key="b",
    region_name="us-east-1")
client.meta.service_model.operation_model("GetObject")
gc.collect()
traced, _ = tracemalloc.get_traced_memory()
print(json.dumps({"traced": traced, "rss": rss() - before_rss}))
"""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", help="(unused: no cluster is needed)")
    parser.parse_args()
    for loader in ("botocore", "plain"):
        done = subprocess.run([sys.executable, "-c", MEASURE, loader], capture_output=True, text=True, check=True)
        got = json.loads(done.stdout)
        print(f"{loader:9s} traced {got['traced'] / 2**20:6.1f} MiB   resident set grown {got['rss'] / 2**20:6.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
