"""A session on a node whose folders the control plane cannot read (issue 26, ADR 0041): a
control-plane host (its Ray head has no CPU) and one worker host, each a network namespace
with private folders (tests/distributed/private_nodes.py), storage in a bucket only the
control plane reaches. A notebook placed on the worker answers its JupyterLab page and a
kernel cell over the WebSocket through the control plane's proxy, which reaches it through the
relay of the session's rank actor; a trial of another tenant on the same node, in a network
namespace of its own, sees none of its node's ports (the relay's included).
"""

from __future__ import annotations

import pytest

from tests.distributed.netns import unavailable_reason
from tests.distributed.private_nodes import CP_IP, private_cluster

pytestmark = [pytest.mark.slow, pytest.mark.ray, pytest.mark.e2e]

REASON = unavailable_reason()


@pytest.mark.skipif(REASON is not None, reason=f"private hosts: {REASON}")
@pytest.mark.timeout(1500)  # two Ray nodes and JupyterLab's start on a loaded machine
def test_a_notebook_on_another_node_answers_through_the_relay() -> None:
    with private_cluster(workers=1, cpus_per_node=3) as cluster:
        (node,) = cluster.workers
        lines = cluster.run_driver(
            [
                "-m", "tests.distributed.session_relay_driver",
                "--root", str(cluster.control.folder),
                "--ray-address", cluster.ray_address,
                "--ip", CP_IP,
                "--node-work", str(node.work),
            ],
            timeout_s=900,
        )  # fmt: skip
    session = next(line for line in lines if line["event"] == "session")
    assert session["placed"] == [node.ip], session
    assert session["node_folder_seen"] == []  # the control plane sees nothing of the node's
    assert session["page_status"] == 200, session
    assert session["page_is_lab"], session
    assert str(session["printed"]).strip() == "kernel says 42"
    assert session["refusals"] == {"none": 401, "other_tenant": 404}
    intruder = next(line for line in lines if line["event"] == "intruder")
    assert intruder["state"] == "COMPLETED", intruder
    assert intruder["tenant"] == "teamb"
    assert intruder["placed"] == [node.ip]
    log = str(intruder["log"])
    # it runs in a network namespace of its own (issue 24): it sees no port of its node, the
    # session's relay included (the relay's own refusal of a wrong secret is tested in
    # tests/adapters/test_session_relay.py)
    assert "RELAYS FOUND 0" in log, log
    assert "RELAY " not in log, log
    assert str(intruder["session_after"]).strip() == "still 42"
