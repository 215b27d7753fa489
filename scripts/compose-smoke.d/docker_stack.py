"""The smoke run under Docker Engine and Compose v2 (`scripts/compose-smoke --engine docker`).

Compose itself honours `depends_on` and health conditions, so each run is one command: a
line of the README's stack block, `[VAR=value ...] docker compose [--profile P ...] up
--build --exit-code-from loadtest`, read from README.md and run as written. The only
addition is the environment that moves every published port to a free one (this machine
runs its own PostgreSQL and Redis on the default ports).

Besides the load test's verdict and exit code, a run checks:
- under `monitoring`, every dashboard panel from every instance in Prometheus, while the
  attack runs (`--exit-code-from` stops the whole stack when the load test ends), and the
  Grafana stand-in's provisioning;
- under `router`, that every product's purchases went to one instance (HAProxy's log line
  of each request names the instance);
- under `ha`, a failover after it (`Failover`): the stack started again as it was left,
  the primary's container killed, a standby promoted, every order sold still there on it,
  and a second load test selling on it;
- after `down -v`, that nothing of the project is left: no container, network or volume
  (the anonymous volumes of the images' VOLUMEs included).
"""

import argparse
import http.client
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request

from standins import Standins
from stack import (CACHE, EXIT_SERVICE, PROJECT, ROOT, Failure, Interrupted, Phases, PrometheusCheck,
                   free_port, grafana_reported_ok, image_ids, load_compose, raise_interrupted_on_signals,
                   remove_images_made, show_last_lines, stack_image_names)

README = ROOT / "README.md"
PROJECT_LABEL = f"label=com.docker.compose.project={PROJECT}"
# Every published port of the file, moved to a free one for each run.
PORT_VARIABLES = ["POSTGRES_PORT", "REDIS_PORT", "ZOOKEEPER_PORT", "ETCD_PORT",
                  "APP1_PORT", "APP2_PORT", "APP3_PORT", "APP1_OPS_PORT", "APP2_OPS_PORT",
                  "APP3_OPS_PORT", "PROMETHEUS_PORT", "GRAFANA_PORT", "ROUTER_PORT"]
PATRONI_MEMBERS = ["patroni1", "patroni2", "patroni3"]
PATRONICTL = ["patronictl", "-c", "/etc/patroni/patroni.yml"]


def readme_runs():
    """The README's stack commands, as (label, environment, arguments after `docker
    compose`): every line of a ```sh block that runs `docker compose ... up --build
    --exit-code-from loadtest`, comments skipped."""
    runs, in_block = [], False
    for line in README.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            in_block = stripped in ("```sh", "```bash")
            continue
        if not in_block or stripped.startswith("#") or "docker compose" not in stripped:
            continue
        words = shlex.split(stripped)
        env = {}
        while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        if words[:2] != ["docker", "compose"] or words[-4:] != ["up", "--build", "--exit-code-from", EXIT_SERVICE]:
            continue
        args = words[2:]
        profiles = [args[i + 1] for i, word in enumerate(args[:-1]) if word == "--profile"]
        runs.append(("+".join(profiles) or "default", env, args))
    if not runs:
        raise Failure(f"no `docker compose ... up --build --exit-code-from {EXIT_SERVICE}` line in {README}")
    return runs


def profiles_of(args):
    return [args[i + 1] for i, word in enumerate(args[:-1]) if word == "--profile"]


class DockerStack:
    def __init__(self, log_dir):
        self.log_dir = log_dir
        self.cli = ["docker"]

    def out(self, *args, check=True):
        done = subprocess.run([*self.cli, *args], capture_output=True, text=True)
        if check and done.returncode != 0:
            raise Failure(f"docker {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def compose(self, env, *args, check=True, **kwargs):
        cmd = ["docker", "compose", *args]
        done = subprocess.run(cmd, env={**os.environ, **env}, cwd=ROOT, **kwargs)
        if check and done.returncode != 0:
            raise Failure(f"docker compose {' '.join(args)} exited {done.returncode}")
        return done

    def containers(self):
        return self.out("ps", "-a", "--filter", PROJECT_LABEL, "--format", "{{.Names}}", check=False).split()

    # --- one run ------------------------------------------------------------------------

    def run(self, label, env, args, phases):
        """The README's command, as written, with the ports of `env`: its verdict and exit code."""
        profiles = profiles_of(args)
        # Its clock runs from before the image build; `finish` stops it if the run ends first.
        checker = PrometheusCheck(int(env["PROMETHEUS_PORT"]), within_s=3600) if "monitoring" in profiles else None
        if checker:
            checker.start_in_background()
        shown = " ".join(f"{k}={v}" for k, v in env.items() if k not in PORT_VARIABLES)
        print(f"+ {shown} docker compose {' '.join(args)}".replace("+  ", "+ "), flush=True)
        result = phases.run(f"{label}: docker compose {' '.join(args)}", self.attack, env, args)
        if "ha" in profiles:
            phases.run(f"{label}: the primary killed, a standby promoted, no order lost, the sale resumes",
                       Failover(self, env, args).run, result[2])
        if "router" in profiles:
            phases.run(f"{label}: the router sent each product to one instance", self.router_check)
        if checker:
            phases.run(f"{label}: Prometheus, every dashboard panel from every instance", checker.finish)
            phases.run(f"{label}: the Grafana stand-in's provisioning check", self.grafana_check)
        return result

    def attack(self, env, args):
        proc = subprocess.Popen(["docker", "compose", *args], env={**os.environ, **env}, cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        verdict, output = None, []
        for line in proc.stdout:
            # The load test redraws its progress line with carriage returns.
            line = line.rstrip("\n").split("\r")[-1]
            print(line, flush=True)
            output.append(line)
            match = re.search(r"VERDICT (PASS|FAIL).*", line)
            if match:
                verdict = match.group(0)
        code = proc.wait()
        print(f"loadtest verdict: {verdict or '(none)'}; docker compose exit code {code}", flush=True)
        if verdict is None or not verdict.startswith("VERDICT PASS") or code != 0:
            raise Failure(f"the load test did not pass: verdict {verdict!r}, exit code {code}")
        return verdict, code, "\n".join(output)

    def grafana_check(self):
        grafana_reported_ok(self.logs_of("grafana"))

    def logs_of(self, service):
        names = [n for n in self.containers() if re.search(rf"-{service}-\d+$", n)]
        if len(names) != 1:
            raise Failure(f"expected one {service} container, found {names}")
        logs = subprocess.run([*self.cli, "logs", names[0]], capture_output=True, text=True)
        return (logs.stdout + logs.stderr).splitlines()

    def router_check(self):
        """Under `router`: HAProxy's log line of every request names the instance that
        answered it; every product's purchases must have gone to one instance, which logged
        purchases of it in its own access log, and no other instance may have logged a
        purchase of it (nothing went round the router)."""
        served = {}
        for line in self.logs_of("router"):
            match = re.search(r" instances/(\S+) .*\"POST /api/products/(\d+)/purchase ", line)
            if match:
                served.setdefault(match.group(2), {}).setdefault(match.group(1), 0)
                served[match.group(2)][match.group(1)] += 1
        if not served:
            raise Failure("the router's log has no purchase: the load test did not go through it")
        for product, instances in sorted(served.items()):
            print(f"product {product}: purchases per instance through the router {instances}", flush=True)
        spread = {p: i for p, i in served.items() if len(i) != 1}
        if spread:
            raise Failure(f"products whose purchases went to more than one instance: {spread}")
        for app in ["app1", "app2", "app3"]:
            logged = {}
            for line in self.logs_of(app):
                match = re.search(r'"path":"/api/products/(\d+)/purchase".*"target":"seckill::access"', line)
                if match:
                    logged[match.group(1)] = logged.get(match.group(1), 0) + 1
            print(f"{app}: purchases in its own log {logged}", flush=True)
            for product, count in logged.items():
                if app not in served.get(product, {}):
                    raise Failure(f"{app} logged {count} purchases of product {product}, "
                                  f"which the router sent elsewhere ({served.get(product)})")
            for product, instances in served.items():
                if app in instances and not logged.get(product):
                    raise Failure(f"the router sent purchases of product {product} to {app}, whose access "
                                  f"log has none (is seckill::access logging off?)")

    # --- logs and teardown --------------------------------------------------------------

    def save_logs(self, label):
        folder = self.log_dir / label
        folder.mkdir(parents=True, exist_ok=True)
        for name in self.containers():
            logs = subprocess.run([*self.cli, "logs", "-t", name], capture_output=True, text=True)
            (folder / f"{name}.log").write_text(logs.stdout + logs.stderr)
        print(f"container logs of {label}: {folder}", flush=True)

    def show_failed_logs(self, label):
        show_last_lines(self.log_dir / label)

    def down(self, env, args):
        """`docker compose [--profile ...] down -v`, then what is left of the project: every
        container, network and volume (the anonymous volumes found through the containers
        before they go), each an error, removed so the next run starts clean."""
        containers = self.out("ps", "-a", "-q", "--filter", PROJECT_LABEL, check=False).split()
        anonymous = self.out(
            "inspect", "--format", '{{range .Mounts}}{{if eq .Type "volume"}}{{.Name}} {{end}}{{end}}',
            *containers, check=False,
        ).split() if containers else []
        profile_args = [w for p in profiles_of(args) for w in ("--profile", p)]
        self.compose(env, *profile_args, "down", "-v", "-t", "10", check=False,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        left = []
        for kind, listing in [("container", ["ps", "-a", "-q"]), ("network", ["network", "ls", "-q"]),
                              ("volume", ["volume", "ls", "-q"])]:
            ids = self.out(*listing, "--filter", PROJECT_LABEL, check=False).split()
            if ids:
                left.append(f"{kind}s {ids}")
                self.out(kind, "rm", "-f", *ids, check=False)
        still = [v for v in anonymous if self.out("volume", "inspect", v, check=False).strip() not in ("", "[]")]
        if still:
            left.append(f"anonymous volumes {still}")
            self.out("volume", "rm", "-f", *still, check=False)
        if left:
            raise Failure(f"`down -v` left {'; '.join(left)} (removed now)")
        print("down -v left no container, network or volume of the project", flush=True)


class Failover:
    """Under `ha`, after the README's command has passed: the stack started again as it was
    left (the same containers, so the same cluster and the orders just sold), the primary's
    container killed with SIGKILL, as a machine dies, and then:
    - a standby promoted (its Patroni log says so, after the kill), and HAProxy reaching it:
      the time from the kill is printed;
    - every order of the product the load test sold still there, read through HAProxy on the
      new primary;
    - every app ready again (/readyz), and the load test run again on the two members left:
      a new product sold, its books checked.
    The primary is killed while no write is in flight, so this shows the stack's failover and
    that sold orders survive it; that an order answered 201 survives a kill in the middle of
    its commit (synchronous_mode_strict) is shown by loadtest/tests/failover.rs."""

    def __init__(self, stack, env, args):
        self.stack = stack
        self.env = {**os.environ, **env}
        self.profile_args = [w for p in profiles_of(args) for w in ("--profile", p)]

    def compose(self, *args, check=True, **kwargs):
        done = subprocess.run(["docker", "compose", *self.profile_args, *args], env=self.env, cwd=ROOT,
                              capture_output=True, text=True, **kwargs)
        if check and done.returncode != 0:
            raise Failure(f"docker compose {' '.join(args)}: {done.stderr.strip()[-2000:]}")
        return done

    def leader(self, among):
        """The member Patroni's cluster view names leader, asked of the first of `among` that
        answers; None while none leads."""
        for member in among:
            done = self.compose("exec", "-T", member, *PATRONICTL, "list", "-f", "json", check=False,
                                timeout=60)
            try:
                rows = json.loads(done.stdout or "[]") if done.returncode == 0 else []
            except json.JSONDecodeError:
                rows = []
            if rows:
                for row in rows:
                    if row.get("Role") == "Leader" and row.get("State") == "running":
                        return row["Member"]
        return None

    def through_haproxy(self, member, sql):
        """`sql` run by psql in `member`'s container, through HAProxy (the apps' way to the
        primary), as the superuser; None if it failed."""
        done = self.compose("exec", "-T", member, "sh", "-c",
                            'PGPASSWORD="$PATRONI_SUPERUSER_PASSWORD" PGCONNECT_TIMEOUT=2 '
                            f'psql -h haproxy -U postgres -d seckill -tAX -c "{sql}"', check=False, timeout=60)
        return done.stdout.strip() if done.returncode == 0 else None

    def run(self, first_output):
        try:
            self.failover(first_output)
        except subprocess.TimeoutExpired as timeout:
            raise Failure(f"timed out: {' '.join(timeout.cmd)}")

    def apps_ready(self, within_s):
        """Every app's /readyz answers 200 on its published operators' port."""
        deadline = time.monotonic() + within_s
        for app in ["app1", "app2", "app3"]:
            url = f"http://127.0.0.1:{self.env[app.upper() + '_OPS_PORT']}/readyz"
            while True:
                try:
                    with urllib.request.urlopen(url, timeout=2) as response:
                        if response.status == 200:
                            break
                except (OSError, http.client.HTTPException):
                    pass
                if time.monotonic() > deadline:
                    raise Failure(f"{app} not ready ({url}) within {within_s} s of HAProxy's new primary")
                time.sleep(0.5)

    def failover(self, first_output):
        product = re.search(r"=== BOOKS \(product (\d+)\) ===", first_output)
        sold = re.search(r"VERDICT PASS .*\borders=(\d+)", first_output)
        if not product or not sold:
            raise Failure("the load test's output names no product and orders to check after the failover")
        product, sold = product.group(1), int(sold.group(1))
        print("starting the stack again as it was left", flush=True)
        self.compose("up", "-d", "--wait", "--no-recreate", "app1", "app2", "app3", timeout=600)
        old = self.leader(PATRONI_MEMBERS)
        if old not in PATRONI_MEMBERS:
            raise Failure(f"no member leads before the kill (Patroni says {old!r})")
        survivors = [m for m in PATRONI_MEMBERS if m != old]
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
        self.compose("kill", "-s", "SIGKILL", old)
        killed = time.monotonic()
        print(f"*** killed the primary {old} (SIGKILL)", flush=True)
        new, primary_at, orders = None, None, None
        deadline = killed + 120
        while time.monotonic() < deadline:
            # Until its lease runs out, the killed member is still the leader in etcd.
            leader = self.leader(survivors)
            new = leader if leader in survivors else new
            answer = self.through_haproxy(
                survivors[0], f"SELECT pg_is_in_recovery(), count(*) FROM orders WHERE product_id = {product}")
            if new and answer and answer.startswith("f|"):
                primary_at, orders = time.monotonic(), int(answer.split("|")[1])
                break
            time.sleep(0.5)
        if primary_at is None:
            raise Failure(f"{old} killed: no new primary through HAProxy within 120 s (Patroni's leader: {new!r})")
        print(f"{new} leads; HAProxy reached it as primary {primary_at - killed:.1f} s after the kill", flush=True)
        logs = self.compose("logs", "--no-log-prefix", "--since", since, new).stdout
        if "promoted self to leader by acquiring session lock" not in logs:
            raise Failure(f"{new} leads, but its Patroni log since the kill does not say it promoted itself")
        if orders != sold:
            raise Failure(f"product {product}: {orders} orders on the new primary, {sold} before the kill")
        print(f"product {product}: all {sold} orders on the new primary", flush=True)
        # The apps' pooled connections to the old primary fail once; each app says on
        # /readyz when it reaches the new one. The killed member stays down.
        self.apps_ready(120)
        print("+ docker compose run --rm --no-deps loadtest   (a new product, on the new primary)", flush=True)
        again = subprocess.run(["docker", "compose", *self.profile_args, "run", "--rm", "--no-deps", EXIT_SERVICE],
                               env=self.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=600)
        verdict = re.findall(r"VERDICT (?:PASS|FAIL).*", again.stdout)
        print(verdict[-1] if verdict else again.stdout[-3000:], flush=True)
        if again.returncode != 0 or not verdict or not verdict[-1].startswith("VERDICT PASS"):
            raise Failure(f"the load test after the failover: exit code {again.returncode}, verdict {verdict[-1:]}")


def main():
    parser = argparse.ArgumentParser(description="The smoke run of the compose stack under Docker: "
                                     "the README's stack commands, each run as written and checked.")
    parser.add_argument("--keep-images", action="store_true",
                        help="keep the images this run made (stand-ins, seckill:local, seckill-loadtest:local, "
                             "seckill-patroni:local)")
    labels = [label for label, _, _ in readme_runs()]
    parser.add_argument("--only", choices=labels, action="append",
                        help="run only this command of the README, by its profiles (repeatable); default: all")
    args = parser.parse_args()

    stack = DockerStack(CACHE / "logs" / time.strftime("%Y%m%dT%H%M%S"))
    phases = Phases()
    runs = [r for r in readme_runs() if not args.only or r[0] in args.only]
    raise_interrupted_on_signals()

    before = image_ids(stack.out)
    standins = Standins(stack.cli, CACHE, "host")
    compose = load_compose()
    profile_runs = [(label, env, profiles_of(run_args)) for label, env, run_args in runs]
    results, failures, current = [], [], None
    try:
        phases.run("stand-in base images", standins.ensure, stack_image_names(compose, profile_runs))
        for label, env, run_args in runs:
            run_env = {**env, **{name: str(free_port()) for name in PORT_VARIABLES}}
            current = (label, run_env, run_args)
            print(f"\n##### run {label}", flush=True)
            try:
                verdict, code, _ = stack.run(label, run_env, run_args, phases)
                results.append((label, verdict, code))
            except Failure as error:
                failures.append(f"{label}: {error}")
                stack.save_logs(label)
                stack.show_failed_logs(label)
            else:
                stack.save_logs(label)
            current = None
            try:
                phases.run(f"{label}: down -v, nothing left", stack.down, run_env, run_args)
            except Failure as error:
                failures.append(f"{label}: {error}")
    except Failure as error:
        failures.append(str(error))
    except Interrupted as signal_name:
        failures.append(f"interrupted ({signal_name})")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if current:
            stack.save_logs(current[0])
            print("tearing down (further Ctrl-C is ignored until it is done)", flush=True)
            try:
                stack.down(current[1], current[2])
            except Failure as error:
                failures.append(str(error))
        if not args.keep_images:
            phases.run("remove the images this run made", remove_images_made, stack.out, before, compose,
                       profile_runs)
        phases.summary()
    for label, verdict, code in results:
        print(f"RESULT {label}: {verdict}; exit code {code}", flush=True)
    if failures:
        for failure in failures:
            print(f"FAILED {failure}", flush=True)
        print(f"\nSMOKE FAIL: {len(failures)} failure(s), logs in {stack.log_dir}", flush=True)
        return 1
    print(f"\nSMOKE PASS: {len(results)} runs under Docker", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
