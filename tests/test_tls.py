"""TLS and mutual TLS on the coordinator, with real certificates and a real
coordinator process: plain text to a TLS port, an untrusted server, and
clients without a certificate, with an expired one or one from another CA
are all refused, and change nothing."""

from __future__ import annotations

import hashlib
import http.client
import os
import re
import signal
import ssl

import grpc
import pytest

from fthsdp.client import CoordinatorClient
from fthsdp.core.credentials import TlsFiles
from fthsdp.core.errors import CoordinatorUnavailable
from fthsdp.protos.v1 import coordinator_pb2 as pb
from tests.harness.cli import fthsdp, one_line_error
from tests.harness.processes import AgentProcess, CoordinatorProcess
from tests.harness.tls_certs import make_certificates


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


def tls_coordinator(tmp_path, certs, mutual: bool) -> CoordinatorProcess:
    args = ["--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key")]
    if mutual:
        args += ["--tls-ca", str(certs / "ca.pem")]
    return CoordinatorProcess(tmp_path, *args, "--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s").start()


def client_tls(certs, name: str = "") -> TlsFiles:
    if not name:
        return TlsFiles(ca=str(certs / "ca.pem"))
    return TlsFiles(str(certs / "ca.pem"), str(certs / f"{name}.pem"), str(certs / f"{name}.key"))


REGISTER = pb.RegisterRequest(job="default", replica_id="intruder", address="127.0.0.1:1", world_size=1)


def refused(address: str, tls: TlsFiles | None) -> None:
    with CoordinatorClient([address], timeout=3, tls=tls) as client:
        for method, request in (("Status", pb.StatusRequest()), ("Register", REGISTER)):
            with pytest.raises(CoordinatorUnavailable):
                client.call(method, request)


def test_tls_server_refuses_plain_text_and_untrusted_clients_see_no_service(tmp_path, certs):
    c = tls_coordinator(tmp_path, certs, mutual=False)
    try:
        refused(c.address, None)  # plain text to the TLS port
        refused(c.address, TlsFiles())  # TLS, but trusting only the system roots
        with CoordinatorClient([c.address], tls=client_tls(certs)) as client:
            status = client.status()
        assert [r.replica_id for r in status.replicas] == []  # nothing registered by the refused calls
    finally:
        c.stop()


@pytest.mark.parametrize("presented", ["", "expired", "stranger"], ids=["no-certificate", "expired", "other-ca"])
def test_mutual_tls_refuses_clients_without_a_valid_certificate(tmp_path, certs, presented):
    c = tls_coordinator(tmp_path, certs, mutual=True)
    try:
        refused(c.address, client_tls(certs, presented))
        with CoordinatorClient([c.address], tls=client_tls(certs, "client")) as client:
            assert [r.replica_id for r in client.status().replicas] == []
    finally:
        c.stop()


def test_cli_over_mutual_tls(tmp_path, certs):
    c = tls_coordinator(tmp_path, certs, mutual=True)
    try:
        ok = fthsdp("status", "--coordinator", c.address, "--tls-ca", str(certs / "ca.pem"),
                    "--tls-cert", str(certs / "client.pem"), "--tls-key", str(certs / "client.key"))
        assert ok.returncode == 0, ok.stderr
        one_line_error(fthsdp("status", "--coordinator", c.address, "--timeout", "2"), 1, "no coordinator answered")
        one_line_error(fthsdp("status", "--coordinator", c.address, "--tls-cert", str(certs / "client.pem")), 2,
                       "go together")
    finally:
        c.stop()


def test_coordinator_refuses_half_a_tls_configuration(tmp_path, certs):
    one_line_error(fthsdp("coordinator", "--bind", "127.0.0.1:0", "--tls-ca", str(certs / "ca.pem")), 2,
                   "needs --tls-cert")
    one_line_error(fthsdp("coordinator", "--bind", "127.0.0.1:0", "--tls-cert", str(certs / "server.pem"),
                          "--tls-key", str(tmp_path / "missing.key")), 2, "cannot read")


def test_agent_and_ranks_train_and_catch_up_over_mutual_tls_with_the_token(tmp_path, certs):
    token = tmp_path / "token"
    token.write_text("tls-and-token\n")
    c = CoordinatorProcess(tmp_path, "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                           "--tls-ca", str(certs / "ca.pem"), "--token-file", str(token),
                           "--heartbeat-interval", "200ms", "--heartbeat-timeout", "2s").start()
    credentials = ("--token-file", str(token), "--tls-ca", str(certs / "ca.pem"),
                   "--tls-cert", str(certs / "node.pem"), "--tls-key", str(certs / "node.key"))
    agents = [
        AgentProcess(tmp_path, c.address, f"r{i}", i, 2, "--steps", "1000000", "--wait-for", "2", "--hidden", "64",
                     agent_args=credentials).start()
        for i in range(2)
    ]
    try:
        first = agents[1].read_until(lambda line: "admitted" in line)
        agents[0].read_until(lambda line: line.get("step", 0) >= 5)
        os.kill(first["pid"], signal.SIGKILL)
        again = agents[1].read_until(lambda line: "admitted" in line and line["pid"] != first["pid"], timeout=60)
        assert again["catch_up"] and again["catch_up"]["source"] == "r0"
        assert again["catch_up"]["transport"] == "https"  # the catch-up took the same credentials
        agents[1].read_until(lambda line: "step" in line and line["t"] > again["t"], timeout=60)
    finally:
        for a in agents:
            a.stop()
        c.stop()


def _catch_up_server_of(agent: AgentProcess) -> tuple[str, str]:
    """The address and certificate fingerprint its rank logs at start."""
    lines = [line for line in agent.log_path.read_text(errors="replace").splitlines()
             if "serving catch-up on" in line]
    match = re.search(r"serving catch-up on (\S+) \(https, ephemeral certificate sha256 ([0-9a-f]{64})\)", lines[-1])
    assert match, lines[-1]
    return match.group(1), match.group(2)


def test_catch_up_over_tls_with_pinned_ephemeral_certificates_under_server_only_tls(tmp_path, certs):
    """Server-only TLS (the replicas hold a CA file, no certificate): each
    catch-up server serves an ephemeral certificate whose fingerprint goes
    through the coordinator; the restarted replica catches up over HTTPS, and
    the source refuses the job token itself, as it refuses no token."""
    token = tmp_path / "token"
    token.write_text("server-only-tls\n")
    c = CoordinatorProcess(tmp_path, "--tls-cert", str(certs / "server.pem"), "--tls-key", str(certs / "server.key"),
                           "--token-file", str(token), "--heartbeat-interval", "200ms",
                           "--heartbeat-timeout", "2s").start()
    credentials = ("--token-file", str(token), "--tls-ca", str(certs / "ca.pem"))
    agents = [
        AgentProcess(tmp_path, c.address, f"r{i}", i, 2, "--steps", "1000000", "--wait-for", "2", "--hidden", "64",
                     agent_args=credentials).start()
        for i in range(2)
    ]
    try:
        first = agents[1].read_until(lambda line: "admitted" in line)
        agents[0].read_until(lambda line: line.get("step", 0) >= 5)
        os.kill(first["pid"], signal.SIGKILL)
        again = agents[1].read_until(lambda line: "admitted" in line and line["pid"] != first["pid"], timeout=60)
        assert again["catch_up"] and again["catch_up"]["source"] == "r0"
        assert again["catch_up"]["transport"] == "https"
        agents[1].read_until(lambda line: "step" in line and line["t"] > again["t"], timeout=60)

        address, fingerprint = _catch_up_server_of(agents[0])
        host, port = address.rsplit(":", 1)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        for authorization in (None, "Bearer server-only-tls"):  # no token; the raw job token
            conn = http.client.HTTPSConnection(host, int(port), timeout=10, context=context)
            conn.request("POST", "/v1/snapshots?wait=1", headers={"Authorization": authorization} if authorization
                         else {})
            response = conn.getresponse()
            assert response.status == 401, (authorization, response.status, response.read())
            assert response.read().count(b"\n") == 1
            assert conn.sock is not None
            served = hashlib.sha256(conn.sock.getpeercert(binary_form=True)).hexdigest()
            assert served == fingerprint  # the certificate it registered is the one it serves
            conn.close()
        plain = http.client.HTTPConnection(host, int(port), timeout=10)
        with pytest.raises((OSError, http.client.HTTPException)):
            plain.request("GET", "/v1/health")
            plain.getresponse().read()  # no plain HTTP on a TLS port
        plain.close()
        agents[0].read_until(lambda line: "step" in line and line["t"] > again["t"] + 0.5, timeout=60)  # unharmed
    finally:
        for a in agents:
            a.stop()
        c.stop()


def test_with_mutual_tls_a_host_speaks_only_for_the_host_id_its_certificate_names(tmp_path, certs):
    """A Host-stream hello is refused (PERMISSION_DENIED, nothing recorded)
    unless the client certificate's common name or a DNS name of it is the
    hello's host id (fthsdp/coordinator/hosts/stream.py ``check_certificate``)."""
    c = tls_coordinator(tmp_path, certs, mutual=True)
    try:
        def hello(cert: str, host_id: str) -> pb.HostPush:
            with CoordinatorClient([c.address], tls=client_tls(certs, cert)) as client:
                call = client.stub(c.address).Host(iter([pb.HostRequest(hello=pb.HostHello(
                    host_id=host_id, replica_id="r1", replica_rank=1, num_replicas=2, nnodes=2, nproc=1))]),
                    timeout=10)
                return next(iter(call))

        assert hello("node", "localhost").WhichOneof("message") == "welcome"  # a DNS name of its certificate
        assert hello("client", "client").WhichOneof("message") == "welcome"  # its common name
        for cert, host_id in (("client", "localhost"), ("node", "client")):
            with pytest.raises(grpc.RpcError) as e:
                hello(cert, host_id)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "must name the host id it speaks for" in e.value.details()
        with CoordinatorClient([c.address], tls=client_tls(certs, "client")) as client:
            hosts = {h.host_id for g in client.status().groups for h in g.hosts}
        assert hosts <= {"localhost", "client"}, hosts
    finally:
        c.stop()
