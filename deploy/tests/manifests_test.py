#!/usr/bin/env python3
"""The Kubernetes manifests and container files, checked offline against the binaries.

    manifests_test.py BUILD_DIR SOURCE_DIR

No cluster and no schema validator is available offline (kubeconform and kubeval are not in
Debian), so this checks what breaks a deployment of *these* binaries: yamllint; every document
has its required fields; the ConfigMaps' TOML files are read by the real strata-server and
strata-agent (--config ... --print-config: every key a flag, every value valid); the ports the
configs listen on are the containers' ports, which the Services and the /healthz probes name;
every file a config refers to and the store and spool directories are mounted; the agent has
the host PID namespace, the node name as its host and exactly the systemd unit's capabilities;
the images are the ones deploy/container/build.sh tags, with entry points the install rules
put there; every container has resource requests and limits.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

build, src = sys.argv[1], sys.argv[2]
kdir = os.path.join(src, "deploy", "kubernetes")
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)


# yamllint, the Debian package.
if shutil.which("yamllint"):
    r = subprocess.run(["yamllint", "-f", "parsable", "-d",
                        "{extends: default, rules: {line-length: {max: 100}, "
                        "document-start: disable}}", kdir], capture_output=True, text=True)
    check(r.returncode == 0, "yamllint deploy/kubernetes " + r.stdout.strip())
else:
    print("SKIP: yamllint is not installed (Debian package yamllint)")

docs = []
for name in sorted(os.listdir(kdir)):
    if name.endswith(".yaml"):
        with open(os.path.join(kdir, name)) as f:
            for d in yaml.safe_load_all(f):
                if d:
                    docs.append((name, d))
check(len(docs) >= 8, f"{len(docs)} documents")
by_kind = {}
for name, d in docs:
    ok = all(k in d for k in ("apiVersion", "kind", "metadata")) and "name" in d["metadata"]
    check(ok, f"{name}: {d.get('kind')} {d.get('metadata', {}).get('name')} has apiVersion, "
          "kind, metadata.name")
    if d["kind"] != "Namespace":
        check(d["metadata"].get("namespace") == "strata",
              f"{name}: {d['metadata']['name']} in namespace strata")
    by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d

version = re.search(r"project\(strata VERSION ([0-9.]+)",
                    open(os.path.join(src, "CMakeLists.txt")).read()).group(1)
unit = open(os.path.join(src, "deploy", "systemd", "strata-agent.service")).read()
unit_caps = re.search(r"^AmbientCapabilities=(.*)$", unit, re.M).group(1).split()


def toml_values(text):
    """key -> value of the top-level scalar keys (the subset the configs use)."""
    out = {}
    for line in text.splitlines():
        m = re.match(r'^([a-z0-9-]+)\s*=\s*"([^"]*)"', line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


work = tempfile.mkdtemp(prefix="strata_manifests_")


def run_config(binary, text, label):
    """The binary reads the config; paths of mounted files are replaced by existing files."""
    paths = {}
    for key, value in toml_values(text).items():
        if value.startswith("/etc/strata/"):
            local = os.path.join(work, key)
            open(local, "w").write("x\n")
            paths[value] = local
    for value, local in paths.items():
        text = text.replace(f'"{value}"', f'"{local}"')
    cfg = os.path.join(work, label + ".toml")
    open(cfg, "w").write(text)
    r = subprocess.run([os.path.join(build, "bin", binary), "--config", cfg, "--print-config"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"{binary} reads the {label} ConfigMap: {r.stderr.strip()}")


def container(workload):
    return workload["spec"]["template"]["spec"]["containers"][0]


def mounted(c, path):
    return any(path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
               for m in c.get("volumeMounts", []))


def config_mount(c):
    args = c.get("args", [])
    return args[args.index("--config") + 1] if "--config" in args else None


# The server.
server_cm = by_kind["ConfigMap"]["strata-server-config"]["data"]["server.toml"]
run_config("strata-server", server_cm, "server")
sconf = toml_values(server_cm)
sts = by_kind["StatefulSet"]["strata-server"]
sc = container(sts)
ports = {p["name"]: p["containerPort"] for p in sc["ports"]}
check(int(sconf["listen"].rsplit(":", 1)[1]) == ports.get("grpc"),
      f"listen {sconf['listen']} is the container's grpc port {ports.get('grpc')}")
check(int(sconf["http"].rsplit(":", 1)[1]) == ports.get("http"),
      f"http {sconf['http']} is the container's http port {ports.get('http')}")
check(sconf["listen"].startswith("0.0.0.0:") and sconf["http"].startswith("0.0.0.0:"),
      "the server listens on every interface of its pod")
check(config_mount(sc) == "/etc/strata/server.toml" and mounted(sc, "/etc/strata/server.toml"),
      "the server's --config file is mounted")
for key, value in sconf.items():
    if value.startswith("/"):
        check(mounted(sc, value), f"server {key} = {value} is on a mounted volume")
pvc = [v["metadata"]["name"] for v in sts["spec"].get("volumeClaimTemplates", [])]
data_mount = [m for m in sc["volumeMounts"] if m["mountPath"] == sconf["data"]]
check(bool(data_mount) and data_mount[0]["name"] in pvc,
      f"data {sconf['data']} is the persistent volume claim {pvc}")
tls = "tls-cert" in sconf
for probe, path in (("startupProbe", "/healthz"), ("readinessProbe", "/readyz"),
                    ("livenessProbe", "/healthz")):
    p = sc.get(probe, {}).get("httpGet", {})
    check(p.get("path") == path and p.get("port") in ("http", ports.get("http")),
          f"{probe} asks {path} on the http port")
    check(p.get("scheme", "HTTP") == ("HTTPS" if tls else "HTTP"),
          f"{probe} scheme {p.get('scheme', 'HTTP')} matches TLS {'on' if tls else 'off'}")
check(sts["spec"]["template"]["spec"]["securityContext"].get("runAsNonRoot") is True,
      "the server runs as non-root")
check(sc["securityContext"]["capabilities"]["drop"] == ["ALL"] and
      "add" not in sc["securityContext"]["capabilities"], "the server has no capabilities")
services = by_kind["Service"]
for name in ("strata-ingest", "strata-query", "strata-ui", "strata-server"):
    check(name in services, f"Service {name}")
for name, svc in services.items():
    check(svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"],
          f"Service {name} selects the server's pods")
    for p in svc["spec"]["ports"]:
        check(p["targetPort"] in ports or p["targetPort"] in ports.values(),
              f"Service {name} port {p['port']} targets a container port ({p['targetPort']})")
check(sts["spec"]["serviceName"] in services and
      services[sts["spec"]["serviceName"]]["spec"].get("clusterIP") == "None",
      "the StatefulSet's governing Service is headless")

# The agent.
agent_cm = by_kind["ConfigMap"]["strata-agent-config"]["data"]["agent.toml"]
run_config("strata-agent", agent_cm, "agent")
aconf = toml_values(agent_cm)
ds = by_kind["DaemonSet"]["strata-agent"]
ac = container(ds)
check(ds["spec"]["template"]["spec"].get("hostPID") is True, "the agent has the host PID namespace")
env = {e["name"]: e for e in ac.get("env", [])}
check(env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") ==
      "spec.nodeName", "NODE_NAME comes from the downward API (spec.nodeName)")
args = ac.get("args", [])
check("--host" in args and args[args.index("--host") + 1] == "$(NODE_NAME)",
      "the agent's --host is the node name")
caps = ac["securityContext"]["capabilities"]
check(caps.get("drop") == ["ALL"], "the agent drops every capability")
check(sorted("CAP_" + c for c in caps.get("add", [])) == sorted(unit_caps),
      f"the agent adds exactly the systemd unit's capabilities {unit_caps}")
check(ac["securityContext"].get("privileged") is False and
      ac["securityContext"].get("allowPrivilegeEscalation") is False,
      "the agent is not privileged and cannot escalate")
host, port = aconf["server"].rsplit(":", 1)
svc_name = host.split(".")[0]
check(svc_name in services and host.endswith(".strata.svc") and
      int(port) in [p["port"] for p in services[svc_name]["spec"]["ports"]],
      f"the agent's server {aconf['server']} is a Service port")
check(config_mount(ac) == "/etc/strata/agent.toml" and mounted(ac, "/etc/strata/agent.toml"),
      "the agent's --config file is mounted")
for key, value in aconf.items():
    if value.startswith("/"):
        check(mounted(ac, value), f"agent {key} = {value} is on a mounted volume")

# Images, entry points, resources.
for workload, comp in ((sts, "server"), (ds, "agent")):
    c = container(workload)
    check(c["image"] == f"localhost/strata-{comp}:{version}",
          f"{comp} image {c['image']} is what deploy/container/build.sh tags")
    r = c.get("resources", {})
    check(all(k in r.get(x, {}) for x in ("requests", "limits") for k in ("cpu", "memory")),
          f"{comp} has cpu and memory requests and limits")
    cf = open(os.path.join(src, "deploy", "container", f"Containerfile.{comp}")).read()
    check(cf.startswith("#") and "FROM scratch" in cf, f"Containerfile.{comp} is FROM scratch")
    entry = re.search(r'ENTRYPOINT \["([^"]+)"', cf).group(1)
    check(entry == f"/usr/bin/strata-{comp}", f"Containerfile.{comp} runs {entry}")
    cmake = open(os.path.join(src, "deploy", "CMakeLists.txt")).read()
    check(f"install(TARGETS strata-{comp} RUNTIME DESTINATION ${{CMAKE_INSTALL_BINDIR}}" in cmake,
          f"the install rules put strata-{comp} in /usr/bin")

shutil.rmtree(work)
if failures:
    print(f"{len(failures)} failures")
    sys.exit(1)
print("PASS")
