"""The smoke run of the compose stack under podman (entry: `scripts/compose-smoke`).

Phases: the stand-in base images; then, for each lock profile, the stack built and brought
up, attacked by its one-shot load test, Prometheus and the Grafana stand-in checked, and the
stack taken down. Every phase prints how long it took. Teardown (`down -v`, the project's
networks and volumes, the images this run made unless `--keep-images`) runs on success, on
failure and on Ctrl-C.

Why the stack is brought up in stages: podman-compose waits for `condition:
service_healthy` only on podman 4.6 or later, and ignores it (with a warning) on Debian
bookworm's podman 4.3, which would start the apps before PostgreSQL is ready. So this script
does what Docker Compose does with the file: it starts the services in the order their
`depends_on` gives, runs each health check the file defines (`podman healthcheck run`, what a
systemd timer would do, there being no systemd here) until it passes, and only then starts
the services that depend on it. The last stage is `up --exit-code-from loadtest` of the
load test alone, whose exit code is the run's.
"""

import argparse
import contextlib
import fcntl
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from standins import Standins

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DASHBOARDS = ROOT / "deploy/grafana/dashboards"
PROMETHEUS_CONFIG = ROOT / "deploy/prometheus/prometheus.yml"
PROJECT = "seckill"
# Stand-ins, virtualenvs and the containers' logs of past runs.
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "seckill-compose-smoke"
EXIT_SERVICE = "loadtest"

# The runs: the default lock, then Redlock over the `redlock` profile's three masters.
RUNS = [
    ("redis", {"LOCK_STRATEGY": "redis"}, ["monitoring"]),
    ("redlock", {"LOCK_STRATEGY": "redlock"}, ["monitoring", "redlock"]),
]

# TIMING: how long a service may take to pass its health check. The app once took 45 s to
# start on a busy two-core machine (migrations, then the first connections); PostgreSQL's
# first start runs initdb.
HEALTHY_WITHIN_S = 240
# TIMING: how long after the load test's exit the Prometheus check may still look: the
# rules' rates run over 10 s, so a sale that ended then is still in them.
PROMETHEUS_GRACE_S = 20


class Failure(Exception):
    pass


class Interrupted(BaseException):
    pass


class HeavyLock:
    """With `--lock FILE`, the CPU-heavy phases (building images, starting and attacking the
    stack) hold an exclusive flock on FILE and release it in between, so a shared machine's
    other builds that take the same lock never run beside them."""

    def __init__(self, path):
        self.path = path

    @contextlib.contextmanager
    def held(self, what):
        if not self.path:
            yield
            return
        with open(self.path, "a") as f:
            start = time.monotonic()
            print(f"waiting for the lock {self.path} ({what})", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
            print(f"lock taken after {time.monotonic() - start:.0f} s", flush=True)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


class Phases:
    """Each phase's name and duration, printed as it ends and again at the end."""

    def __init__(self):
        self.done = []

    def run(self, name, fn, *args):
        print(f"\n=== {name}", flush=True)
        start = time.monotonic()
        outcome = "failed"
        try:
            result = fn(*args)
            outcome = "ok"
            return result
        finally:
            took = time.monotonic() - start
            self.done.append((name, took, outcome))
            print(f"=== {name}: {outcome}, {took:.0f} s", flush=True)

    def summary(self):
        print("\nphase durations:", flush=True)
        total = 0.0
        for name, took, outcome in self.done:
            total += took
            print(f"  {took:7.0f} s  {outcome:6}  {name}", flush=True)
        print(f"  {total:7.0f} s  total", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_compose():
    with open(COMPOSE_FILE) as f:
        return yaml.safe_load(f)


def active_services(compose, profiles):
    return {
        name: service
        for name, service in compose["services"].items()
        if not service.get("profiles") or set(service["profiles"]) & set(profiles)
    }


def dependencies(service, active):
    """`depends_on` as (service, condition) pairs, without the optional ones that are off."""
    deps = service.get("depends_on") or {}
    if isinstance(deps, list):
        deps = {d: {"condition": "service_started"} for d in deps}
    return [
        (name, how.get("condition", "service_started"))
        for name, how in deps.items()
        if name in active or how.get("required", True)
    ]


def stages(active):
    """The services in start order: each stage depends only on earlier ones."""
    placed, order = set(), []
    remaining = dict(active)
    while remaining:
        stage = sorted(
            n for n, s in remaining.items() if all(d in placed for d, _ in dependencies(s, active))
        )
        if not stage:
            raise Failure(f"a dependency cycle, or a dependency on an inactive service: {sorted(remaining)}")
        order.append(stage)
        placed.update(stage)
        for n in stage:
            del remaining[n]
    return order


class Stack:
    def __init__(self, args, podman_env):
        self.args = args
        self.env = podman_env
        self.podman = ["podman"]
        self.compose_cmd = [sys.executable, "-m", "podman_compose", "--in-pod", "false", "-f", str(COMPOSE_FILE)]
        self.log_dir = None

    # --- commands -----------------------------------------------------------------------

    def podman_out(self, *args, check=True):
        done = subprocess.run([*self.podman, *args], env=self.env, capture_output=True, text=True)
        if check and done.returncode != 0:
            raise Failure(f"podman {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def compose(self, profiles, run_env, *args, check=True, **kwargs):
        cmd = [*self.compose_cmd]
        for p in profiles:
            cmd += ["--profile", p]
        cmd += list(args)
        print("+ podman-compose " + " ".join(cmd[len(self.compose_cmd):]), flush=True)
        done = subprocess.run(cmd, env={**self.env, **run_env}, cwd=ROOT, **kwargs)
        if check and done.returncode != 0:
            raise Failure(f"podman-compose {' '.join(args)} exited {done.returncode}")
        return done

    def container(self, service):
        names = self.podman_out(
            "ps", "-a",
            "--filter", f"label=io.podman.compose.project={PROJECT}",
            "--filter", f"label=com.docker.compose.service={service}",
            "--format", "{{.Names}}",
        ).split()
        if len(names) != 1:
            raise Failure(f"expected one container for {service}, found {names}")
        return names[0]

    def state(self, container):
        out = self.podman_out("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container)
        status, code = out.split()
        return status, int(code)

    # --- waiting ------------------------------------------------------------------------

    def wait_for(self, service, condition, active):
        container = self.container(service)
        has_check = bool(active[service].get("healthcheck"))
        start = time.monotonic()
        while True:
            status, code = self.state(container)
            if condition == "service_completed_successfully":
                if status == "exited":
                    if code == 0:
                        return
                    raise Failure(f"{service} exited {code}")
            elif status in ("exited", "stopped", "dead"):
                raise Failure(f"{service} stopped (exit code {code}) before it was {condition}")
            elif condition == "service_started" and status == "running":
                return
            elif condition == "service_healthy":
                if not has_check:
                    raise Failure(f"{service} has no health check, but another service waits for it to be healthy")
                if status == "running":
                    check = subprocess.run(
                        [*self.podman, "healthcheck", "run", container],
                        env=self.env, capture_output=True, text=True,
                    )
                    if check.returncode == 0:
                        print(f"{service} healthy after {time.monotonic() - start:.0f} s", flush=True)
                        return
            if time.monotonic() - start > HEALTHY_WITHIN_S:
                raise Failure(f"{service} not {condition} within {HEALTHY_WITHIN_S} s")
            time.sleep(2)

    # --- one run ------------------------------------------------------------------------

    def up(self, label, profiles, run_env, phases, lock):
        compose = load_compose()
        active = active_services(compose, profiles)
        order = stages(active)
        if order[-1] != [EXIT_SERVICE]:
            raise Failure(f"{EXIT_SERVICE} should be the last to start alone, but the order is {order}")
        print("start order: " + " | ".join(" ".join(s) for s in order), flush=True)

        def build():
            # One service at a time: podman-compose 1.6 builds all of them at once, which is
            # four release builds of one image side by side on two cores. In turn, the
            # first builds and the others find every layer in the cache.
            for service in [n for n, s in active.items() if s.get("build")]:
                self.compose(profiles, run_env, "build", service)

        with lock.held("the image build"):
            phases.run(f"{label}: build the stack's images (podman-compose build, per service)", build)

        def bring_up():
            for stage in order:
                conditions = sorted({d for service in stage for d in dependencies(active[service], active)})
                for dep, condition in conditions:
                    self.wait_for(dep, condition, active)
                if stage != order[-1]:
                    self.compose(profiles, run_env, "up", "-d", "--no-build", "--no-deps", *stage,
                                 stdout=subprocess.DEVNULL)

        checker = PrometheusCheck(int(run_env["PROMETHEUS_PORT"])) if "monitoring" in profiles else None
        with lock.held("starting and attacking the stack"):
            phases.run(f"{label}: start the services in depends_on order, each healthy", bring_up)
            if checker:
                checker.start()
            result = phases.run(f"{label}: the attack (up --exit-code-from {EXIT_SERVICE})",
                                self.attack, profiles, run_env)
        if checker:
            phases.run(f"{label}: Prometheus, every dashboard panel from every instance",
                       checker.finish)
            phases.run(f"{label}: the Grafana stand-in's provisioning check", self.grafana_check)
        return result

    def attack(self, profiles, run_env):
        cmd = [*self.compose_cmd]
        for p in profiles:
            cmd += ["--profile", p]
        cmd += ["up", "--no-build", "--no-deps", "--exit-code-from", EXIT_SERVICE, EXIT_SERVICE]
        print("+ podman-compose " + " ".join(cmd[len(self.compose_cmd):]), flush=True)
        proc = subprocess.Popen(cmd, env={**self.env, **run_env}, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        verdict = None
        for line in proc.stdout:
            # The load test redraws its progress line with carriage returns.
            print(line.rstrip("\n").split("\r")[-1], flush=True)
            match = re.search(r"VERDICT (PASS|FAIL).*", line)
            if match:
                verdict = match.group(0)
        code = proc.wait()
        print(f"loadtest verdict: {verdict or '(none)'}; podman-compose exit code {code}", flush=True)
        if verdict is None or not verdict.startswith("VERDICT PASS") or code != 0:
            raise Failure(f"the load test did not pass: verdict {verdict!r}, exit code {code}")
        return verdict, code

    def grafana_check(self):
        logs = subprocess.run([*self.podman, "logs", self.container("grafana")], env=self.env,
                              capture_output=True, text=True)
        grafana_reported_ok((logs.stdout + logs.stderr).splitlines())

    def save_logs(self, label):
        folder = self.log_dir / label
        folder.mkdir(parents=True, exist_ok=True)
        names = self.podman_out("ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}",
                                "--format", "{{.Names}}", check=False).split()
        for name in names:
            logs = subprocess.run([*self.podman, "logs", name], env=self.env, capture_output=True, text=True)
            (folder / f"{name}.log").write_text(logs.stdout + logs.stderr)
        print(f"container logs of {label}: {folder}", flush=True)
        return names

    def show_failed_logs(self, label):
        show_last_lines(self.log_dir / label)

    def down(self, profiles, run_env):
        # `down -v` leaves the anonymous volumes of the images' VOLUMEs (PostgreSQL's data,
        # Prometheus's): found through the containers before they go, removed after.
        containers = self.podman_out("ps", "-a", "-q", "--filter", f"label=io.podman.compose.project={PROJECT}",
                                     check=False).split()
        anonymous = self.podman_out(
            "inspect", "--format", '{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} {{end}}{{end}}',
            *containers, check=False,
        ).split() if containers else []
        self.compose(profiles, run_env, "down", "-v", "-t", "5", check=False,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if anonymous:
            self.podman_out("volume", "rm", "-f", *anonymous, check=False)
        # What podman-compose may leave: containers of the project, its networks and volumes.
        for kind, listing in [
            ("container", ["ps", "-a", "-q"]),
            ("network", ["network", "ls", "-q"]),
            ("volume", ["volume", "ls", "-q"]),
        ]:
            ids = self.podman_out(*listing, "--filter", f"label=io.podman.compose.project={PROJECT}",
                                  check=False).split()
            if ids:
                self.podman_out(kind, "rm", "-f", *ids, check=False)
        left = self.podman_out("ps", "-a", "-q", "--filter", f"label=io.podman.compose.project={PROJECT}",
                               check=False).split()
        if left:
            print(f"warning: containers left after teardown: {left}", flush=True)


# How long Prometheus may take, once the stack is up, to scrape every instance twice.
SCRAPED_WITHIN_S = 60


class PrometheusCheck:
    """Polls Prometheus while the attack runs: every expression of every dashboard panel must
    return, from each of the three scrape targets, a finite value; the throughput panel a
    value above zero from at least one. A panel whose rule is missing, or an instance that is not scraped,
    fails it."""

    def __init__(self, port, within_s=None):
        self.base = f"http://127.0.0.1:{port}"
        # How long Prometheus may take to scrape every instance twice, from `start`.
        self.within_s = within_s or SCRAPED_WITHIN_S
        self.start_failure = None
        self.panels = dashboard_panels()
        self.instances = scrape_targets()
        # expression -> instance -> largest finite value seen
        self.seen = {expr: {} for _, expr in self.panels}
        self.first_seen = {}
        self.stop = threading.Event()
        self.errors = []
        self.thread = threading.Thread(target=self.poll, daemon=True)
        self.started = None

    def start(self):
        self.wait_for_first_scrapes()
        self.started = time.monotonic()
        self.thread.start()

    def start_in_background(self):
        """`start` on a thread of its own, for a stack that comes up in one command: a
        failure to see the first scrapes is kept for `finish`."""
        def start():
            try:
                self.start()
            except Failure as error:
                self.start_failure = error
        threading.Thread(target=start, daemon=True).start()

    def wait_for_first_scrapes(self):
        """Before the attack: every instance scraped, twice. A sale lasts about a second;
        a Prometheus whose first scrape came after it would see only final counters (a rate
        of 0, no quantile) and fail the check although the panels work."""
        deadline = time.monotonic() + self.within_s
        while True:
            try:
                scraped = {series["metric"].get("instance")
                           for series in self.query("count_over_time(seckill_orders_total[1m]) >= 2")}
            except (OSError, ValueError, KeyError, Failure):
                scraped = set()
            if set(self.instances) <= scraped:
                return
            if self.stop.is_set() or time.monotonic() > deadline:
                raise Failure(f"Prometheus had not scraped every instance twice within {self.within_s} s: "
                              f"{sorted(scraped)} of {self.instances}")
            time.sleep(0.5)

    def query(self, expr):
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise Failure(f"Prometheus refused {expr!r}: {body}")
        return body["data"]["result"]

    def satisfied(self, title, expr):
        values = self.seen[expr]
        if set(values) != set(self.instances):
            return False
        if positive(title, expr):
            return any(v > 0 for v in values.values())
        return True

    def poll(self):
        while not self.stop.is_set():
            try:
                for title, expr in self.panels:
                    for series in self.query(expr):
                        instance = series["metric"].get("instance")
                        value = float(series["value"][1])
                        if instance in self.instances and math.isfinite(value):
                            best = self.seen[expr].get(instance)
                            self.seen[expr][instance] = value if best is None else max(best, value)
                    if expr not in self.first_seen and self.satisfied(title, expr):
                        self.first_seen[expr] = time.monotonic() - self.started
            except (OSError, ValueError, KeyError, Failure) as error:
                self.errors.append(str(error))
            if all(self.satisfied(t, e) for t, e in self.panels):
                return
            self.stop.wait(1)

    def finish(self):
        if self.start_failure:
            raise self.start_failure
        if self.started is None:
            self.stop.set()
            raise Failure("Prometheus was never seen scraping every instance")
        self.thread.join(PROMETHEUS_GRACE_S)
        self.stop.set()
        self.thread.join()
        try:
            targets = json.load(urllib.request.urlopen(f"{self.base}/api/v1/targets", timeout=5))
            for target in targets["data"]["activeTargets"]:
                print(f"PROMETHEUS target {target['labels'].get('instance')}: {target['health']}", flush=True)
        except OSError:
            # Under Docker, `--exit-code-from` has stopped Prometheus with the stack.
            print("PROMETHEUS targets: not listed (Prometheus has stopped with the stack)", flush=True)
        failed = []
        for title, expr in self.panels:
            ok = self.satisfied(title, expr)
            values = " ".join(f"{i}={self.seen[expr][i]:.4g}" if i in self.seen[expr] else f"{i}=none"
                              for i in self.instances)
            when = f" (all there {self.first_seen[expr]:.0f} s after the attack began)" if ok else ""
            print(f"PROMETHEUS {'ok  ' if ok else 'FAIL'} {title}: {expr}: max {values}{when}", flush=True)
            if not ok:
                failed.append(title)
        if self.errors:
            print(f"Prometheus query errors ({len(self.errors)}), the last: {self.errors[-1]}", flush=True)
        if failed:
            raise Failure(f"dashboard panels without data from every instance: {failed}")


def positive(title, expr):
    """The throughput panel must show the sale: above zero on some instance. Not on every
    one: the instance that holds the lock sells most batches, and one run here saw an
    instance at 0.44 orders/s beside two at 16 to 18. That every instance answered
    purchases in the window is the latency panel's finite p99 from each."""
    return "orders" in expr


def dashboard_panels():
    panels = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                panels.append((panel["title"], target["expr"]))
    if not panels:
        raise Failure(f"no dashboard panels in {DASHBOARDS}")
    return panels


def scrape_targets():
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    return sorted(t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"])


def grafana_reported_ok(log_lines):
    """The Grafana stand-in's report, from its container's log: printed, and a Failure
    unless it says the provisioning is OK."""
    lines = [l for l in log_lines if l.startswith("grafana stand-in:")]
    for line in lines:
        print(line, flush=True)
    if not any("provisioning OK" in l for l in lines):
        raise Failure("the Grafana stand-in did not report its provisioning OK")


def show_last_lines(folder):
    """The last lines of every container log a failed run left in `folder`."""
    for path in sorted(folder.glob("*.log")):
        print(f"--- last lines of {path.name}", flush=True)
        for line in path.read_text().splitlines()[-25:]:
            print("    " + line.split("\r")[-1], flush=True)


def raise_interrupted_on_signals():
    """SIGINT and SIGTERM raise Interrupted, so that the run under way is torn down."""
    def interrupted(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)


def remove_images_made(engine_out, before, compose, runs):
    """Remove the images that appeared since `before` (image ids) and are this run's: the
    stand-ins' official names, the images the stack builds, the untagged layers of builds;
    an image someone else built or loaded meanwhile under another name stays."""
    built = {s["image"] for s in compose["services"].values() if s.get("build")}
    wanted = {n.split("/")[-1] for n in stack_image_names(compose, runs)} | built
    listed = image_names(engine_out)
    made = sorted(i for i in image_ids(engine_out) - before if ours(listed.get(i, set()), wanted))
    if made:
        engine_out("rmi", "-f", *made, check=False)
    print(f"removed {len(made)} images this run made; the stand-ins stay cached in {CACHE / 'images'}",
          flush=True)


def image_ids(engine_out):
    """Every local image's id; `engine_out` runs the engine's command and returns its output."""
    return set(engine_out("images", "-a", "-q", "--no-trunc", check=False).split())


def image_names(engine_out):
    """Image id -> its `repository:tag` names (none for an intermediate layer)."""
    names = {}
    listing = engine_out("images", "-a", "--no-trunc", "--format",
                         "{{.ID}} {{.Repository}}:{{.Tag}}", check=False)
    for line in listing.splitlines():
        image, _, name = line.partition(" ")
        names.setdefault(image, set())
        if name and not name.startswith("<none>"):
            names[image].add(name)
    return names


def ours(names, wanted):
    """Whether an image that appeared during the run is one this run made: tagged with a
    name the stack uses (a stand-in, the built image), or an untagged layer of a build."""
    return not names or any(name.split("/")[-1] in wanted or name in wanted for name in names)


def stack_image_names(compose, runs):
    """Every image the committed files name for `runs`: the images of the services those
    runs' profiles start, and the `FROM`s (stage names excepted) of the Dockerfiles those
    services build from, less the images the stack builds itself. The services of profiles
    no run uses need no stand-in."""
    profiles = {p for _, _, run_profiles in runs for p in run_profiles}
    services = active_services(compose, profiles).values()
    built = {s.get("image") for s in compose["services"].values() if s.get("build")}
    names = {s["image"] for s in services if s.get("image") and s["image"] not in built}
    dockerfiles = sorted({ROOT / s["build"]["context"] / s["build"].get("dockerfile", "Dockerfile")
                          for s in services if s.get("build")})
    for dockerfile in dockerfiles:
        stages_seen = set()
        for line in dockerfile.read_text().splitlines():
            match = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line.strip(), re.IGNORECASE)
            if match:
                if match.group(1) not in stages_seen:
                    names.add(match.group(1))
                if match.group(2):
                    stages_seen.add(match.group(2))
    return sorted(names)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep-images", action="store_true",
                        help="keep the images this run made (stand-ins, seckill:local and seckill-loadtest:local)")
    parser.add_argument("--lock", metavar="FILE",
                        help="hold an flock on FILE during the heavy phases only (a shared machine)")
    parser.add_argument("--only", choices=[r[0] for r in RUNS], action="append",
                        help="run only this lock profile (repeatable); default: all")
    args = parser.parse_args()

    env = dict(os.environ)
    stack = Stack(args, env)
    stack.log_dir = CACHE / "logs" / time.strftime("%Y%m%dT%H%M%S")
    phases = Phases()
    runs = [r for r in RUNS if not args.only or r[0] in args.only]
    raise_interrupted_on_signals()

    before = image_ids(stack.podman_out)
    standins = Standins(stack.podman, CACHE, "host")
    results, failure = [], None
    current, last_label = None, None
    try:
        compose = load_compose()
        lock = HeavyLock(args.lock)
        with lock.held("the stand-in images"):
            phases.run("stand-in base images", standins.ensure, stack_image_names(compose, runs))
        for label, lock_env, profiles in runs:
            ports = {name: str(free_port()) for name in
                     ["POSTGRES_PORT", "REDIS_PORT", "APP1_PORT", "APP2_PORT", "APP3_PORT",
                      "APP1_OPS_PORT", "APP2_OPS_PORT", "APP3_OPS_PORT",
                      "PROMETHEUS_PORT", "GRAFANA_PORT"]}
            run_env = {**lock_env, **ports}
            current, last_label = (label, profiles, run_env), label
            print(f"\n##### run {label}: {' '.join(f'{k}={v}' for k, v in lock_env.items())}, "
                  f"profiles {', '.join(profiles)}", flush=True)
            try:
                verdict, code = stack.up(label, profiles, run_env, phases, lock)
                results.append((label, verdict, code))
            finally:
                stack.save_logs(label)
                phases.run(f"{label}: down -v", stack.down, profiles, run_env)
                current = None
    except Failure as error:
        failure = str(error)
        if last_label:
            stack.show_failed_logs(last_label)
    except Interrupted as signal_name:
        failure = f"interrupted ({signal_name})"
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if current:
            stack.save_logs(current[0])
            print("tearing down (further Ctrl-C is ignored until it is done)", flush=True)
            stack.down(current[1], current[2])
        if not args.keep_images:
            phases.run("remove the images this run made", remove_images_made, stack.podman_out, before,
                       load_compose(), runs)
        phases.summary()
    for label, verdict, code in results:
        print(f"RESULT {label}: {verdict}; exit code {code}", flush=True)
    if failure:
        print(f"\nSMOKE FAIL: {failure}", flush=True)
        return 1
    print(f"\nSMOKE PASS: {len(results)} runs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
