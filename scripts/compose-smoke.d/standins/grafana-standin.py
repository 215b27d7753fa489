"""Stand-in for Grafana: reads the provisioning Grafana would read, checks that every panel
names a provisioned data source and that the data source answers a query from inside the
stack's network, prints one line saying so (`grafana stand-in: provisioning OK ...`), and
then idles until it is stopped. It renders nothing."""

import glob
import json
import os
import signal
import sys
import time
import urllib.parse
import urllib.request

import yaml

PROVISIONING = os.environ.get("GF_PATHS_PROVISIONING", "/etc/grafana/provisioning")


def fail(message):
    print(f"grafana stand-in: FAIL {message}", flush=True)
    sys.exit(1)


def yaml_files(folder):
    paths = sorted(glob.glob(f"{PROVISIONING}/{folder}/*.yml") + glob.glob(f"{PROVISIONING}/{folder}/*.yaml"))
    return [(path, yaml.safe_load(open(path))) for path in paths]


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sources = {}
    for path, doc in yaml_files("datasources"):
        for source in doc.get("datasources", []):
            sources[source.get("uid", source["name"])] = source
    if not sources:
        fail(f"no data source in {PROVISIONING}/datasources")

    panels = 0
    dashboards = 0
    for path, doc in yaml_files("dashboards"):
        for provider in doc.get("providers", []):
            folder = provider["options"]["path"]
            files = sorted(glob.glob(f"{folder}/*.json"))
            if not files:
                fail(f"{path}: provider {provider['name']} finds no dashboard in {folder}")
            for file in files:
                dashboard = json.load(open(file))
                dashboards += 1
                for panel in dashboard.get("panels", []):
                    for target in panel.get("targets", []):
                        uid = (target.get("datasource") or panel.get("datasource") or {}).get("uid")
                        if uid not in sources:
                            fail(f"{file}: panel {panel.get('title')!r} uses data source {uid!r}, not provisioned")
                        if not target.get("expr"):
                            fail(f"{file}: panel {panel.get('title')!r} has a target without expr")
                        panels += 1
    if dashboards == 0:
        fail(f"no dashboard provider in {PROVISIONING}/dashboards")

    for uid, source in sources.items():
        url = source["url"].rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": "up"})
        deadline = time.monotonic() + 120
        last = "no answer yet"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if json.load(response).get("status") == "success":
                        break
            except OSError as error:
                last = error
            if time.monotonic() > deadline:
                fail(f"data source {uid} at {source['url']} does not answer: {last}")
            time.sleep(1)

    answering = ", ".join(f"{uid} at {source['url']}" for uid, source in sources.items())
    print(
        f"grafana stand-in: provisioning OK: {dashboards} dashboard(s), {panels} panel "
        f"queries, data source(s) {answering} answer",
        flush=True,
    )
    while True:
        time.sleep(3600)


main()
