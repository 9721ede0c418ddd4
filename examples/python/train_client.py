#!/usr/bin/env python3
"""A fucina.v1.Train client with grpcio: start an evolution-strategies job on a coordinator,
follow it to the end, print one line per generation.

Stubs: generate them from the repository's proto/ once, then put the folder on PYTHONPATH:

    protoc -I proto --python_out=stubs --grpc_out=stubs \
        --plugin=protoc-gen-grpc=$(which grpc_python_plugin) proto/fucina/v1/train.proto
    PYTHONPATH=stubs python3 examples/python/train_client.py --addr 127.0.0.1:50051 \
        --data tasks.jsonl --iterations 10

tasks.jsonl holds one {"prompt": ..., "answer": ...} object per line. Exit status 0 when the
job succeeds (or is stopped), 1 when it fails.
"""
import argparse
import json
import sys

import grpc

from fucina.v1 import train_pb2, train_pb2_grpc


def read_tasks(path):
    tasks = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            tasks.append(train_pb2.TrainTask(prompt=row["prompt"], answer=row["answer"]))
    return tasks


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--addr", default="127.0.0.1:50051")
    p.add_argument("--data", required=True)
    p.add_argument("--holdout")
    p.add_argument("--mode", default="lora", choices=["lora", "full"])
    p.add_argument("--reward", default="nll", choices=["nll", "acc", "rule"])
    p.add_argument("--rule", default="")
    p.add_argument("--population", type=int, default=16)
    p.add_argument("--sigma", type=float, default=1e-3)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--raw", action="store_true", help="prompts without the chat template")
    p.add_argument("--out-dir", default="", help="checkpoints, on the coordinator's disk")
    p.add_argument("--api-key", default="")
    args = p.parse_args()

    metadata = [("authorization", f"Bearer {args.api_key}")] if args.api_key else []
    with grpc.insecure_channel(args.addr) as channel:
        stub = train_pb2_grpc.TrainStub(channel)
        request = train_pb2.StartJobRequest(
            tasks=read_tasks(args.data),
            holdout=read_tasks(args.holdout) if args.holdout else [],
            mode=args.mode, reward=args.reward, rule=args.rule, population=args.population,
            sigma=args.sigma, lr=args.lr, iterations=args.iterations, seed=args.seed,
            raw=args.raw, out_dir=args.out_dir)
        job = stub.StartJob(request, metadata=metadata, timeout=60)
        print(f"job {job.job_id} started", flush=True)
        last = None
        for event in stub.WatchJob(train_pb2.WatchJobRequest(job_id=job.job_id),
                                   metadata=metadata):
            if event.HasField("train_reward"):
                print(f"generation {event.generation}: reward {event.train_reward:.5f}")
            elif event.state == train_pb2.JOB_STATE_RUNNING:
                print(f"generation {event.generation}/{args.iterations}: members mean "
                      f"{event.reward_mean:.5f}, {event.workers} workers, "
                      f"{event.bytes_sent} B sent, {event.bytes_received} B received")
            sys.stdout.flush()
            last = event
        state = train_pb2.JobState.Name(last.state)
        print(f"{state} checksum {last.checksum:016x}")
        if last.error:
            print(last.error, file=sys.stderr)
        return 0 if last.state in (train_pb2.JOB_STATE_SUCCEEDED,
                                   train_pb2.JOB_STATE_STOPPED) else 1


if __name__ == "__main__":
    sys.exit(main())
