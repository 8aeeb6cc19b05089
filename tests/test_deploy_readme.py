"""deploy/README.md against the real thing: its credentials script and TLS
probe work with a real coordinator, and it names only real flags, settings
and files."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys

from tests.harness.deploy_files import DEPLOY, known_variables, need_tool, subcommand_flags


def readme_tls_probe() -> list[str]:
    """The exec probe deploy/README.md gives for a coordinator serving TLS."""
    text = (DEPLOY / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "grpc_health" in b]
    return shlex.split(block.replace("\\\n", ""))


def test_make_certs_script_and_tls_probe_work_with_a_real_coordinator(tmp_path):
    from fthsdp.client import CoordinatorClient
    from fthsdp.core.credentials import TlsFiles, read_token_file
    from tests.harness.processes import CoordinatorProcess

    openssl = need_tool(shutil.which("openssl"), "openssl")
    out = tmp_path / "creds"
    result = subprocess.run(
        ["sh", str(DEPLOY / "make-certs.sh"), str(out), "localhost", "127.0.0.1"], capture_output=True, text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    token = read_token_file(str(out / "token"))
    assert len(token) == 64
    assert oct((out / "ca.key").stat().st_mode & 0o777) == "0o600", "keys are private"
    for name, purpose in (("coordinator", "sslserver"), ("client", "sslclient")):
        check = subprocess.run([openssl, "verify", "-purpose", purpose, "-CAfile", str(out / "ca.crt"),
                                str(out / f"{name}.crt")], capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stdout + check.stderr
    coordinator = CoordinatorProcess(
        tmp_path, "--tls-cert", str(out / "coordinator.crt"), "--tls-key", str(out / "coordinator.key"),
        "--token-file", str(out / "token"),
    ).start()
    try:
        with CoordinatorClient([f"127.0.0.1:{coordinator.port}"], token=token,
                               tls=TlsFiles(str(out / "ca.crt"))) as client:
            assert client.status("default").job == "default"  # TLS and the token accepted
        probe = readme_tls_probe()
        assert probe[:2] == ["python", "-c"]
        code = (probe[2].replace("localhost:29510", f"localhost:{coordinator.port}")
                .replace("/etc/fthsdp/tls/ca.crt", str(out / "ca.crt")))
        assert code != probe[2]
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, f"the README's TLS probe fails on a leading coordinator: {run.stderr}"
        wrong = code.replace("fthsdp.v1.Coordinator", "fthsdp.v1.NoSuchService")
        assert subprocess.run([sys.executable, "-c", wrong], capture_output=True, timeout=60).returncode != 0
    finally:
        coordinator.stop()
    usage = subprocess.run(["sh", str(DEPLOY / "make-certs.sh"), str(tmp_path / "x")], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr


def readme_commands() -> list[tuple[int, str]]:
    """Every line of deploy/README.md that names an fthsdp subcommand, with its number."""
    lines = (DEPLOY / "README.md").read_text().splitlines()
    return [(n, line) for n, line in enumerate(lines, 1)
            if re.search(r"\bfthsdp (coordinator|agent|status|drain|cordon|uncordon)\b", line)]


def test_readme_names_only_real_flags_and_settings():
    flags = subcommand_flags()
    checked = 0
    for number, line in readme_commands():
        for match in re.finditer(r"\bfthsdp (coordinator|agent|status|drain|cordon|uncordon)\b(.*?)(?:`|$| -- )", line):
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", match.group(2)):
                assert flag in flags[match.group(1)], (
                    f"deploy/README.md:{number}: fthsdp {match.group(1)} has no {flag}")
                checked += 1
    assert checked >= 10
    every = flags["coordinator"] | flags["agent"]
    rows = [line for line in (DEPLOY / "README.md").read_text().splitlines() if line.startswith("| `--")]
    assert len(rows) >= 8, "the timeouts table"
    for row in rows:
        for flag in re.findall(r"--[a-z][a-z0-9-]*", row.split("|")[1]):
            assert flag in every, f"deploy/README.md: the table names {flag}, which fthsdp does not have"
    known = set(known_variables())
    text = (DEPLOY / "README.md").read_text()
    named = set(re.findall(r"\bFTHSDP_[A-Z_]*[A-Z]\b", text))
    assert named <= known, f"deploy/README.md names {sorted(named - known)}, which are not settings"
    for path in re.findall(r"\]\((?!https?:)([^)#]+)", text):
        assert (DEPLOY / path).exists(), f"deploy/README.md links to {path}, which does not exist"


def test_readme_flag_check_catches_a_made_up_flag():
    flags = subcommand_flags()
    assert "--leader-ttl" in flags["coordinator"] and "--leader-ttl" not in flags["agent"]
    assert "--standby" in flags["agent"] and "--no-such-flag" not in flags["agent"]

