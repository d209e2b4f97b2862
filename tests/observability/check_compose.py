#!/usr/bin/env python3
"""Checks docker-compose.yml without a Docker engine.

1. Validates it against the Compose specification schema (check-jsonschema ships it:
   `--builtin-schema vendor.compose-spec`).
2. Every file or directory it mounts or builds from exists in the repository: bind mounts
   (`./x:/y`, long syntax `type: bind`), build contexts and Dockerfiles, env_file, configs and
   secrets with `file:`.
3. What runs inside finds what it expects: the Grafana home dashboard is one of
   grafana/dashboards/, and every `rule_files` pattern of the mounted Prometheus
   configuration matches at least one file through the mounts.

    tests/observability/check_compose.py [--compose FILE]   (run with the observability venv)
"""

import argparse
import fnmatch
import posixpath
import subprocess
import sys
from pathlib import Path

import yaml

import obslib


def schema_check(compose):
    # The CLI next to this interpreter (the venv's), so the pinned version runs.
    cli = Path(sys.executable).with_name("check-jsonschema")
    cmd = [str(cli) if cli.exists() else "check-jsonschema",
           "--builtin-schema", "vendor.compose-spec", str(compose)]
    result = subprocess.run(cmd, capture_output=True, text=True)
    out = (result.stdout + result.stderr).strip()
    return ([] if result.returncode == 0 else [f"compose schema: {out}"]), result.returncode == 0


def bind_mounts(service):
    """(host path, container path) of every bind mount of a service."""
    for vol in service.get("volumes", []) or []:
        if isinstance(vol, str):
            parts = vol.split(":")
            if len(parts) >= 2 and parts[0].startswith((".", "/", "~")):
                yield parts[0], parts[1]
        elif isinstance(vol, dict) and vol.get("type") == "bind":
            yield vol["source"], vol["target"]


def host_files(base, service):
    """Every host path a service needs, with what needs it."""
    for host, target in bind_mounts(service):
        yield host, f"mount -> {target}"
    build = service.get("build")
    if isinstance(build, str):
        yield build, "build context"
        yield posixpath.join(build, "Dockerfile"), "Dockerfile"
    elif isinstance(build, dict):
        context = build.get("context", ".")
        yield context, "build context"
        yield posixpath.join(context, build.get("dockerfile", "Dockerfile")), "Dockerfile"
    env_files = service.get("env_file", [])
    for env in [env_files] if isinstance(env_files, str) else env_files:
        yield (env["path"] if isinstance(env, dict) else env), "env_file"


def container_view(base, service, container_path):
    """The host path behind a container path, through the service's bind mounts."""
    best = None
    for host, target in bind_mounts(service):
        inside = container_path == target or container_path.startswith(target.rstrip("/") + "/")
        if inside and (best is None or len(target) > len(best[1])):
            best = (host, target)
    if best is None:
        return None
    rest = container_path[len(best[1]):].lstrip("/")
    return (base / best[0] / rest) if rest else (base / best[0])


def glob_host(base, service, container_pattern):
    directory, pattern = posixpath.split(container_pattern)
    host_dir = container_view(base, service, directory)
    if host_dir is None or not host_dir.is_dir():
        return []
    return [p for p in host_dir.iterdir() if fnmatch.fnmatch(p.name, pattern)]


def inner_checks(base, services):
    problems = []
    prom = services.get("prometheus")
    if prom:
        args = prom.get("command", []) or []
        config = next((a.split("=", 1)[1] for a in args if a.startswith("--config.file=")),
                      "/etc/prometheus/prometheus.yml")
        host_config = container_view(base, prom, config)
        if host_config is None or not host_config.is_file():
            problems.append(f"prometheus: {config} is not mounted from a file")
        else:
            cfg = yaml.safe_load(host_config.read_text())
            for pattern in cfg.get("rule_files", []) or []:
                full = pattern if pattern.startswith("/") else posixpath.join(
                    posixpath.dirname(config), pattern)
                if not glob_host(base, prom, full):
                    problems.append(f"prometheus: rule_files {pattern} ({full}) matches no "
                                    f"mounted file")
    graf = services.get("grafana")
    if graf:
        home = (graf.get("environment") or {}).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
        if home:
            host = container_view(base, graf, home)
            if host is None or not host.is_file():
                problems.append(f"grafana: home dashboard {home} is not a mounted file")
        prov = container_view(base, graf, "/etc/grafana/provisioning")
        if prov is None or not (prov / "datasources").is_dir():
            problems.append("grafana: /etc/grafana/provisioning/datasources is not mounted")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compose", default=str(obslib.REPO / "docker-compose.yml"))
    args = parser.parse_args()
    compose = Path(args.compose).resolve()
    base = compose.parent

    problems, schema_ok = schema_check(compose)
    doc = yaml.safe_load(compose.read_text())
    services = doc.get("services", {})
    checked = 0
    for name, service in services.items():
        for path, what in host_files(base, service):
            checked += 1
            if not (base / path).exists():
                problems.append(f"{name}: {what}: {path} does not exist")
    for section in ("configs", "secrets"):
        for name, item in (doc.get(section) or {}).items():
            if isinstance(item, dict) and "file" in item:
                checked += 1
                if not (base / item["file"]).exists():
                    problems.append(f"{section}.{name}: {item['file']} does not exist")
    problems += inner_checks(base, services)
    for p in problems:
        print(p)
    print(f"check_compose: schema {'ok' if schema_ok else 'FAILED'}, "
          f"{len(services)} services, {checked} host paths, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
