"""Uploads files to S3 the way `aws s3 cp --recursive` does (boto3's transfer manager: one
manager for every file, multipart parts of 16 MiB, 4 requests in flight), for tsnap_bench_s3's
baseline. The endpoint and credentials come from the environment (AWS_ENDPOINT_URL_S3, ...).

    python boto3_upload.py BUCKET PREFIX FILE...   prints the seconds the uploads took
"""

import os
import sys
import time

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from s3transfer.manager import TransferManager


def main() -> None:
    bucket, prefix, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    client = boto3.client(
        "s3",
        endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=8),
    )
    config = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20,
                            max_concurrency=4, use_threads=True)
    start = time.monotonic()
    # One manager for all files, as the CLI's recursive copy: its 4 threads serve every file.
    with TransferManager(client, config) as manager:
        futures = [manager.upload(path, bucket, f"{prefix}/{os.path.basename(path)}")
                   for path in files]
        for future in futures:
            future.result()
    print(f"{time.monotonic() - start:.6f}")


if __name__ == "__main__":
    main()
