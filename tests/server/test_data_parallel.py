"""`corellm serve --data-parallel-size 2`: two engine replicas behind one server — requests are
answered by both (routed by load and prompt prefix, the same prompt to the same replica), and a
replica that dies is reported by /health while the other serves on."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
import urllib.request

import pytest

from tests.server.conftest import Server


def post(url: str, body: dict) -> tuple[int, dict, str]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read()), r.headers.get("X-Corellm-Replica", "")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), ""


def health(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture(scope="module")
def dp_server():
    server = Server("--data-parallel-size", "2", "--max-num-seqs", "8")
    yield server
    server.stop()


def completion(server, prompt: str) -> tuple[int, dict, str]:
    return post(server.url + "/v1/completions", {"model": "SmolLM2-135M-Instruct", "prompt": prompt,
                                                 "max_tokens": 4, "temperature": 0})


def test_both_replicas_answer_and_a_prompt_stays_with_its_replica(dp_server):
    prompts = [f"Question {i}: what is {i} + {i}?" for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: completion(dp_server, p), prompts))
    assert all(status == 200 for status, _, _ in results)
    assert {replica for _, _, replica in results} == {"0", "1"}
    again = [completion(dp_server, p)[2] for p in prompts[:4]]  # one at a time: affinity decides
    first = [completion(dp_server, p)[2] for p in prompts[:4]]
    assert again == first
    status, body = health(dp_server.url)
    assert status == 200 and body["status"] == "ok" and len(body["replicas"]) == 2


def test_ping_is_the_routers_health_and_load_sums_the_replicas(dp_server):
    status, body, _ = post(dp_server.url + "/ping", {})
    assert status == 200 and body["status"] == "ok" and len(body["replicas"]) == 2
    with urllib.request.urlopen(dp_server.url + "/load", timeout=30) as r:
        assert json.loads(r.read()) == {"server_load": 0}
    long = {"model": "SmolLM2-135M-Instruct", "max_tokens": 200, "temperature": 0, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        pending = [pool.submit(post, dp_server.url + "/v1/completions", {**long, "prompt": f"Story {i}:"})
                   for i in range(3)]
        seen, deadline = 0, time.monotonic() + 30
        while seen < 3 and time.monotonic() < deadline:
            with urllib.request.urlopen(dp_server.url + "/load", timeout=30) as r:
                seen = json.loads(r.read())["server_load"]
            time.sleep(0.05)
        assert seen == 3, "the replicas' loads never added up to the three requests in flight"
        assert all(f.result(timeout=120)[0] == 200 for f in pending)


def test_the_replicas_share_the_cores_rather_than_each_taking_them_all(dp_server):
    """Two replicas with every core's threads each spin on each other's cores: a 200-token answer
    took ~10x as long on 2 cores (and past a 120 s timeout on a loaded machine)."""
    import re

    import torch

    threads = [int(n) for n in re.findall(r"CPU kernels: .*, (\d+) threads", dp_server.output())]
    assert threads == [max(1, torch.get_num_threads() // 2)] * 2


def test_a_placement_gives_each_replica_its_share_of_cores_and_its_own_cuda_devices():
    from corellm.server.data_parallel import ReplicaPlacement

    cpu = ReplicaPlacement(size=3, ranks=1, cpu_threads=8)
    assert [cpu.environment(i) for i in range(3)] == [{"OMP_NUM_THREADS": "2"}] * 3
    assert ReplicaPlacement(size=4, ranks=1, cpu_threads=2).environment(3) == {"OMP_NUM_THREADS": "1"}
    gpus = ReplicaPlacement(size=2, ranks=2, cpu_threads=16, cuda_devices=["0", "1", "2", "3", "5"])
    assert [gpus.environment(i)["CUDA_VISIBLE_DEVICES"] for i in range(2)] == ["0,1", "2,3"]
    too_few = ReplicaPlacement(size=2, ranks=2, cpu_threads=16, cuda_devices=["0", "1"])
    assert "CUDA_VISIBLE_DEVICES" not in too_few.environment(1)  # they share what there is (logged)


def test_metrics_give_every_replicas_engine_figures_labelled_by_replica(dp_server):
    """The router's /metrics: its own figures per replica, then both engines' (their requests,
    latency histograms, KV cache), each sample labelled replica="i", one HELP / TYPE a family."""
    from prometheus_client.parser import text_string_to_metric_families

    results = [completion(dp_server, f"Metrics question {i}: what is {i} + {i}?") for i in range(8)]
    served = {replica for _, _, replica in results}
    with urllib.request.urlopen(dp_server.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}  # the format as Prometheus reads it
    assert text.count("# TYPE corellm:time_to_first_token_seconds histogram") == 1
    ttft = {s.labels["replica"]: s.value for s in families["corellm:time_to_first_token_seconds"].samples
            if s.name.endswith("_count")}
    assert set(ttft) == {"0", "1"} and all(ttft[replica] > 0 for replica in served)
    assert {s.labels["replica"] for s in families["corellm:kv_cache_usage_perc"].samples} == {"0", "1"}
    assert {s.labels["replica"] for s in families["corellm:dp_replica_up"].samples} == {"0", "1"}


def test_with_an_api_key_the_routers_metrics_ask_for_it():
    server = Server("--data-parallel-size", "2", "--api-key", "k-7")
    try:
        def get(headers: dict) -> tuple[int, str]:
            request = urllib.request.Request(server.url + "/metrics", headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=30) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

        assert get({})[0] == 401 and get({"Authorization": "Bearer wrong"})[0] == 401
        status, text = get({"Authorization": "Bearer k-7"})
        assert status == 200 and 'corellm:num_requests_running{replica="1"' in text
        assert health(server.url)[0] == 200  # /health stays open, as on one engine
    finally:
        server.stop()


def test_a_request_id_header_goes_through_the_router_and_back(dp_server):
    request = urllib.request.Request(dp_server.url + "/v1/completions", data=json.dumps({
        "model": "SmolLM2-135M-Instruct", "prompt": "Hi", "max_tokens": 2}).encode(),
        headers={"Content-Type": "application/json", "X-Request-Id": "dp-7"})
    with urllib.request.urlopen(request, timeout=120) as r:
        assert r.headers["X-Request-Id"] == "dp-7" and json.loads(r.read())["id"] == "cmpl-dp-7"


def test_a_stored_response_is_found_in_the_replica_that_made_it(dp_server):
    url = dp_server.url + "/v1/responses"
    made = [post(url, {"input": f"Question {i}: what is {i} + {i}?", "max_output_tokens": 3, "temperature": 0})
            for i in range(8)]
    assert all(status == 200 for status, _, _ in made) and {replica for _, _, replica in made} == {"0", "1"}
    for _, body, replica in made:
        with urllib.request.urlopen(f"{url}/{body['id']}", timeout=30) as r:
            assert json.loads(r.read())["output"] == body["output"] and r.headers["X-Corellm-Replica"] == replica
        status, nxt, by = post(url, {"previous_response_id": body["id"], "input": "And twice that?",
                                     "max_output_tokens": 3, "temperature": 0})
        assert status == 200 and by == replica and nxt["previous_response_id"] == body["id"]


def test_a_dead_replica_fails_its_requests_with_503_and_the_other_serves_on(dp_server):
    long = {"model": "SmolLM2-135M-Instruct", "prompt": "Tell me a long story.", "max_tokens": 400,
            "temperature": 0, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pending = pool.submit(post, dp_server.url + "/v1/completions", long)
        victim = None
        deadline = time.monotonic() + 30
        while victim is None and time.monotonic() < deadline:
            _, body = health(dp_server.url)
            victim = next((r for r in body["replicas"] if r["in_flight"] > 0), None)
            time.sleep(0.05)
        assert victim is not None, "the long request never showed up in flight"
        os.kill(victim["pid"], signal.SIGKILL)
        status, body, _ = pending.result(timeout=60)
    assert status == 503 and f"engine replica {victim['replica']} failed" in body["error"]["message"]
    status, body = health(dp_server.url)
    assert status == 200 and body["status"] == "degraded"
    assert body["replicas"][victim["replica"]]["status"] == "dead"
    results = [completion(dp_server, f"After the failure {i}") for i in range(6)]
    survivor = str(1 - victim["replica"])
    assert all(status == 200 and replica == survivor for status, _, replica in results)


def test_the_affinity_key_is_the_prompts_start_whatever_the_route():
    from corellm.server.data_parallel import affinity_key

    def key(body: dict) -> bytes:
        return affinity_key(json.dumps(body).encode())

    assert key({"prompt": "a" * 300}) == key({"prompt": "a" * 300 + "b", "max_tokens": 3})  # only the start counts
    assert key({"messages": [{"role": "user", "content": "x"}]}) != key({"messages": [{"role": "user", "content": "y"}]})
    assert key({"token_ids": [1, 2, 3], "sampling_params": {}}) != key({"token_ids": [4, 5, 6], "sampling_params": {}})
    assert key({"input": "q"}) != key({}) and key({}) == b'""' and affinity_key(b"not json") == b""
