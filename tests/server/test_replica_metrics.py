"""merge_replica_metrics: the data-parallel router's one exposition of its replicas' /metrics,
checked with prometheus_client's own parser on real prometheus_client output."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from corellm.server.replica_metrics import merge_replica_metrics


def replica_text(requests: int, running: float) -> str:
    r = CollectorRegistry()
    Counter("corellm:request_success", "Finished requests", ["model_name", "finished_reason"], registry=r).labels(
        "m", "length").inc(requests)
    Gauge("corellm:num_requests_running", "Running", ["model_name"], registry=r).labels("m").set(running)
    Gauge("corellm:unlabelled", "A gauge without labels", registry=r).set(running + 1)
    h = Histogram("corellm:ttft_seconds", "TTFT", ["model_name"], buckets=(0.1, 1.0), registry=r)
    for _ in range(requests):
        h.labels("m").observe(0.5)
    return generate_latest(r).decode()


def test_each_sample_gets_its_replica_and_each_family_stays_one_group():
    merged = merge_replica_metrics({1: replica_text(3, 2.0), 0: replica_text(5, 1.0)})
    families = {f.name: f for f in text_string_to_metric_families(merged)}
    assert merged.count("# TYPE corellm:ttft_seconds histogram") == 1
    success = {s.labels["replica"]: s.value for s in families["corellm:request_success"].samples
               if s.name.endswith("_total")}
    assert success == {"0": 5.0, "1": 3.0}
    assert all(s.labels["finished_reason"] == "length" and s.labels["model_name"] == "m"
               for s in families["corellm:request_success"].samples if s.name.endswith("_total"))
    counts = {s.labels["replica"]: s.value for s in families["corellm:ttft_seconds"].samples
              if s.name.endswith("_count")}
    assert counts == {"0": 5.0, "1": 3.0}
    assert {s.labels["replica"]: s.value for s in families["corellm:unlabelled"].samples} == {"0": 2.0, "1": 3.0}
    # replica 0's samples of a family come before replica 1's, each family once
    lines = [line for line in merged.splitlines() if line.startswith("corellm:num_requests_running{")]
    assert lines == ['corellm:num_requests_running{replica="0",model_name="m"} 1.0',
                     'corellm:num_requests_running{replica="1",model_name="m"} 2.0']


def test_no_replica_gives_nothing():
    assert merge_replica_metrics({}) == ""
