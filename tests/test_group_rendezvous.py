"""A node agent's part in its group's rounds (fthsdp/agent/node/group_rendezvous.py)
in-process, on a fake Host stream and a fake store: what it sends, and what
it hands the supervisor, as the coordinator's pushes arrive."""

from __future__ import annotations

import queue

from fthsdp.agent.node.config import AgentConfig
from fthsdp.agent.node.group_rendezvous import Assignment, End, GroupRendezvous
from fthsdp.protos.v1 import coordinator_pb2 as pb


class FakeLink:
    def __init__(self, addresses, token, tls, hello, inbox: queue.Queue) -> None:
        self.hello, self.inbox, self.sent, self.left = hello, inbox, [], None

    def send(self, request: pb.HostRequest) -> None:
        self.sent.append(request)

    def close(self, leave=None) -> None:
        self.left = leave


class FakeStore:
    def __init__(self, env) -> None:
        self.port = 7000

    def open(self) -> int:
        self.port += 1
        return self.port

    def close(self) -> None:
        pass


def make(**settings) -> tuple[GroupRendezvous, FakeLink]:
    config = AgentConfig(**{"coordinator": "127.0.0.1:29510", "replica_id": "r1", "replica_rank": 1,
                            "num_replicas": 2, "nnodes": 2, "host_id": "h-b", "max_restarts": 1, **settings})
    r = GroupRendezvous(config, {"FTHSDP_ADVERTISE_HOST": "10.0.0.2"}, "", link=FakeLink, store=FakeStore)
    return r, r._link  # type: ignore[return-value]


def never(timeout: float) -> bool:
    return False


def test_a_round_joined_completed_run_and_ended_by_another_host():
    r, link = make()
    r.inbox.put(pb.HostPush(welcome=pb.HostWelcome(host_id="h-b", round=1)))
    r.inbox.put(pb.HostPush(joined=1))
    r.inbox.put(pb.HostPush(welcome=pb.HostWelcome(host_id="h-b", round=1)))  # the stream opened again
    r.inbox.put(pb.HostPush(complete=pb.RoundComplete(round=1, node_rank=1, store="10.0.0.1:7001",
                                                       hosts=["h-a", "h-b"])))
    got = r.next_round(never)
    assert got == Assignment(1, 1, "10.0.0.1", 7001, "r1", 1, 2)
    assert [m.join for m in link.sent] == [pb.HostJoin(round=1, store="10.0.0.2:7001")] * 2, \
        "its own fresh store, sent again as it was after the stream opened again"
    assert link.hello().node_rank == 1 and link.hello().round == 1, "a reconnect says where it runs"
    assert r.round_ended() is None
    r.inbox.put(pb.HostPush(ended=pb.RoundEnded(round=1, reason="round 1 ended: node rank 0 (h-a): host lost")))
    assert r.round_ended() == "round 1 ended: node rank 0 (h-a): host lost"
    r.inbox.put(pb.HostPush(joined=2))
    r.inbox.put(pb.HostPush(complete=pb.RoundComplete(round=2, node_rank=1, store="10.0.0.1:7002")))
    got = r.next_round(never)
    assert isinstance(got, Assignment) and got.round == 2 and link.sent[-1].join.store == "10.0.0.2:7002"
    # A failure here: reported, and with --max-restarts 1 the next round is one too many.
    r.failed("local rank 0 exited with signal SIGKILL")
    assert link.sent[-1].failure == pb.HostFailure(round=2, reason="local rank 0 exited with signal SIGKILL")
    got = r.next_round(never)
    assert isinstance(got, End) and got.exit_code == 1 and "no restarts left (--max-restarts 1" in got.reason


def test_a_spare_adopted_runs_as_its_group_and_config_follows():
    r, link = make(replica_id="", replica_rank=-1, spare=True)
    assert link.hello().replica_id == "" and link.hello().nnodes == 2
    r.inbox.put(pb.HostPush(welcome=pb.HostWelcome(host_id="h-b")))
    r.inbox.put(pb.HostPush(adopted=pb.SpareAdopted(replica_id="r3", replica_rank=3, round=5, num_replicas=4)))
    r.inbox.put(pb.HostPush(complete=pb.RoundComplete(round=5, node_rank=1, store="10.0.0.1:7001")))
    got = r.next_round(never)
    assert got == Assignment(5, 1, "10.0.0.1", 7001, "r3", 3, 4) and link.sent[-1].join.round == 5
    config = got.config(r.config)
    assert (config.replica_id, config.replica_rank, config.num_replicas, config.node_rank, config.master_port,
            config.spare, config.rendezvous) == ("r3", 3, 4, 1, 7001, False, False)
    assert link.hello().replica_id == "r3", "reconnecting, it is r3's host now"


def test_released_refused_and_stopped_each_end_the_agent_with_their_code():
    r, _ = make(replica_id="", replica_rank=-1, spare=True)
    r.inbox.put(pb.HostPush(welcome=pb.HostWelcome(host_id="h-b")))
    r.inbox.put(pb.HostPush(released="job finished at step 300"))
    assert r.next_round(never) == End(0, "job finished at step 300")
    r, _ = make()
    r.inbox.put(pb.HostPush(refused="group r1 already has its 2 hosts (h-a, h-c)"))
    got = r.next_round(never)
    assert isinstance(got, End) and got.exit_code == 2 and "already has its 2 hosts" in got.reason
    r, _ = make()
    assert r.next_round(lambda timeout: True) == End(0, "stopped while joining a round")


def test_the_hello_says_the_agents_incarnation_and_the_groups_hosts_as_last_pushed():
    """What a coordinator that restarts learns the group from (issue 48)."""
    r, link = make()
    first = link.hello()
    assert len(first.incarnation) == 32 and first.address == "10.0.0.2"
    assert (list(first.hosts), first.hosts_round) == ([], 0), "no round heard of yet"
    r.inbox.put(pb.HostPush(welcome=pb.HostWelcome(host_id="h-b", round=3)))
    r.inbox.put(pb.HostPush(complete=pb.RoundComplete(round=3, node_rank=1, store="10.0.0.1:7001",
                                                       hosts=["h-a", "h-b"])))
    assert isinstance(r.next_round(never), Assignment)
    hello = link.hello()
    assert (list(hello.hosts), hello.hosts_round, hello.round, hello.node_rank) == (["h-a", "h-b"], 3, 3, 1)
    assert hello.incarnation == first.incarnation, "the same agent says the same incarnation at every reconnect"
    r.inbox.put(pb.HostPush(ended=pb.RoundEnded(round=3, reason="host h-c lost")))
    assert r.round_ended() == "host h-c lost"
    r.inbox.put(pb.HostPush(roster=pb.GroupRoster(round=4, hosts=["h-s", "h-b"])))  # a spare took h-a's place
    r.inbox.put(pb.HostPush(roster=pb.GroupRoster(round=2, hosts=["h-a", "h-x"])))  # an older one changes nothing
    r.inbox.put(pb.HostPush(joined=4))
    r.inbox.put(pb.HostPush(complete=pb.RoundComplete(round=4, node_rank=1, store="10.0.0.9:7001")))
    assert isinstance(r.next_round(never), Assignment)
    assert (list(link.hello().hosts), link.hello().hosts_round) == (["h-s", "h-b"], 4)
    assert make()[1].hello().incarnation != first.incarnation, "each agent draws its own"


def test_an_adoption_said_again_after_a_reconnect_is_taken_once():
    r, link = make(replica_id="", replica_rank=-1, spare=True)
    adopted = pb.HostPush(adopted=pb.SpareAdopted(replica_id="r3", replica_rank=3, round=5, num_replicas=4,
                                                  hosts=["h-a", "h-b"]))
    r.inbox.put(pb.HostPush(welcome=pb.HostWelcome(host_id="h-b")))
    r.inbox.put(adopted)
    r.inbox.put(pb.HostPush(welcome=pb.HostWelcome(host_id="h-b", round=5)))  # its stream opened again
    r.inbox.put(adopted)  # the coordinator says it again: it is already r3's, joining round 5
    r.inbox.put(pb.HostPush(complete=pb.RoundComplete(round=5, node_rank=1, store="10.0.0.1:7001")))
    got = r.next_round(never)
    assert got == Assignment(5, 1, "10.0.0.1", 7001, "r3", 3, 4)
    assert [m.join.round for m in link.sent if m.HasField("join")] == [5, 5], "a join, and the same join again"
    assert (list(link.hello().hosts), link.hello().hosts_round) == (["h-a", "h-b"], 5)
