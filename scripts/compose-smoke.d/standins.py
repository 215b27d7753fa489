"""Local stand-ins for the base images the stack names, tagged with the official names.

No registry can be reached from the machines this runs on, so `docker-compose.yml` and the
`Dockerfile` would fail at their first `FROM` or `image:`. Each stand-in is built from a
recipe in `standins/` on a Debian root made by `debootstrap`, and carries the label
`seckill.standin=<hash of its recipe>`. An image of that name without the label is a real
one and is used as it is.

Built stand-ins are saved under the cache directory (keyed by the same hash), so a second
run on one machine loads them instead of building them again.
"""

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECIPES = HERE / "standins"
LABEL = "seckill.standin"
BASE = "docker.io/library/debian:bookworm-slim"
# The certificate authorities this machine adds to Debian's (`update-ca-certificates` reads
# them from here). On a network whose TLS goes through a proxy with its own authority they
# are what lets cargo and apt inside a build reach their registries; usually there are none.
LOCAL_CAS = Path("/usr/local/share/ca-certificates")

# Repository (without tag) -> the recipe that stands in for it: a Containerfile in
# `standins/` and the files of its build context. The base has no Containerfile: it is
# debootstrap's root, imported.
KNOWN = {
    "docker.io/library/debian": None,
    "docker.io/library/rust": ("rust.Containerfile", []),
    "docker.io/library/postgres": ("postgres.Containerfile", ["postgres-entrypoint.sh"]),
    "docker.io/library/redis": ("redis.Containerfile", ["redis-entrypoint.sh"]),
    "docker.io/prom/prometheus": ("prometheus.Containerfile", []),
    "docker.io/grafana/grafana": ("grafana.Containerfile", ["grafana-standin.py"]),
    "docker.io/library/haproxy": ("haproxy.Containerfile", []),
    "quay.io/coreos/etcd": ("etcd.Containerfile", []),
    "docker.io/library/zookeeper": ("zookeeper.Containerfile", ["zookeeper-entrypoint.sh"]),
}


def qualified(name: str) -> str:
    """`postgres:16-alpine` as podman and Docker resolve it: `docker.io/library/postgres:16-alpine`."""
    first = name.split("/")[0]
    if "/" in name and ("." in first or ":" in first or first == "localhost"):
        return name
    if "/" not in name:
        return f"docker.io/library/{name}"
    return f"docker.io/{name}"


def repository(name: str) -> str:
    return qualified(name).rsplit(":", 1)[0]


def debian_mirror() -> str:
    """The Debian mirror apt already uses (debootstrap needs one; no other is reachable)."""
    sources = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if path.is_file():
            sources.append(path.read_text())
    for text in sources:
        for uri in re.findall(r"(?m)^(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text):
            if "security" not in uri:
                return uri
    return "http://deb.debian.org/debian"


def rust_toolchain() -> Path:
    """This machine's Rust toolchain (the `rustc --print sysroot` of the one on PATH)."""
    sysroot = subprocess.run(
        ["rustc", "--print", "sysroot"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return Path(sysroot)


def run(cmd, **kwargs):
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kwargs)


def label_of(engine, tag: str):
    """The stand-in label of the local image `tag`: None if there is no such image, "" if
    it is not a stand-in."""
    inspect = subprocess.run(
        [*engine, "image", "inspect", "--format", "{{ json .Config.Labels }}", tag],
        capture_output=True,
        text=True,
    )
    if inspect.returncode != 0:
        return None
    labels = inspect.stdout.strip()
    match = re.search(r'"%s":"([0-9a-f]+)"' % re.escape(LABEL), labels)
    return match.group(1) if match else ""


class Standins:
    def __init__(self, engine, cache: Path, build_network: str):
        # The engine's command: ["podman"] or ["docker"]; both take the same arguments here.
        self.engine = engine
        self.cache = cache / "images"
        self.cache.mkdir(parents=True, exist_ok=True)
        self.build_network = build_network
        # Tags this run put into the engine's storage (built or loaded): what teardown removes.
        self.made = []

    def recipe_hash(self, repo: str, parent_hash: str) -> str:
        digest = hashlib.sha256(parent_hash.encode())
        recipe = KNOWN[repo]
        if recipe is None:
            digest.update(f"debootstrap --variant=minbase bookworm {debian_mirror()}".encode())
            for ca in local_cas():
                digest.update(ca.read_bytes())
        else:
            containerfile, files = recipe
            for name in [containerfile, *files]:
                digest.update(name.encode())
                digest.update((RECIPES / name).read_bytes())
            if repo.endswith("/rust"):
                digest.update(
                    subprocess.run(
                        ["rustc", "-vV"], check=True, capture_output=True, text=True
                    ).stdout.encode()
                )
        return digest.hexdigest()[:16]

    def ensure(self, names):
        """Make every image in `names` present, stand-ins built or loaded as needed. The base
        goes first: every other recipe starts from it."""
        unknown = [n for n in names if repository(n) not in KNOWN]
        if unknown:
            raise SystemExit(
                f"the stack names images with no stand-in recipe: {unknown} "
                f"(known: {sorted(KNOWN)})"
            )
        ordered = sorted(set(qualified(n) for n in names) | {BASE}, key=lambda n: n != BASE)
        base_hash = None
        for tag in ordered:
            repo = repository(tag)
            recipe_hash = self.recipe_hash(repo, "" if tag == BASE else base_hash)
            present = label_of(self.engine, tag)
            if present == "":
                print(f"{tag}: a real image is present; using it", flush=True)
                recipe_hash = "real"
            elif present == recipe_hash:
                print(f"{tag}: stand-in {recipe_hash} already present", flush=True)
                self.made.append(tag)
            else:
                self.load_or_build(tag, repo, recipe_hash)
            if tag == BASE:
                base_hash = recipe_hash

    def load_or_build(self, tag, repo, recipe_hash):
        archive = self.cache / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', tag)}-{recipe_hash}.tar"
        if archive.is_file():
            run([*self.engine, "load", "-q", "-i", archive])
            if label_of(self.engine, tag) == recipe_hash:
                print(f"{tag}: stand-in {recipe_hash} loaded from {archive}", flush=True)
                self.made.append(tag)
                return
            print(f"{archive} did not hold {tag}; building it again", flush=True)
        if KNOWN[repo] is None:
            self.build_base(tag, recipe_hash)
        else:
            self.build_from_recipe(tag, repo, recipe_hash)
        self.made.append(tag)
        for old in self.cache.glob(f"{re.sub(r'[^A-Za-z0-9_.-]', '_', tag)}-*.tar"):
            old.unlink()
        partial = archive.with_suffix(".partial")
        run([*self.engine, "save", "-o", partial, tag])
        partial.rename(archive)

    def build_base(self, tag, recipe_hash):
        if shutil.which("debootstrap") is None:
            raise SystemExit("debootstrap is needed to build the Debian base (apt-get install debootstrap)")
        with tempfile.TemporaryDirectory(prefix="seckill-debootstrap-", dir=self.cache) as tmp:
            root = Path(tmp) / "root"
            run(["debootstrap", "--variant=minbase", "bookworm", root, debian_mirror()],
                stdout=subprocess.DEVNULL)
            cas = local_cas()
            if cas:
                # Installed with the ca-certificates package, by any image built on this one.
                target = root / LOCAL_CAS.relative_to("/")
                target.mkdir(parents=True, exist_ok=True)
                for ca in cas:
                    shutil.copy2(ca, target / ca.name)
                print(f"this machine's local certificate authorities, added: {[c.name for c in cas]}",
                      flush=True)
            # As the slim image: no package cache, no apt lists (a build runs apt-get update).
            for leftover in ["var/cache/apt/archives", "var/lib/apt/lists"]:
                for item in (root / leftover).glob("*"):
                    if item.is_file():
                        item.unlink()
            tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
            run(
                [*self.engine, "import",
                 "--change", f"LABEL {LABEL}={recipe_hash}",
                 "--change", 'CMD ["bash"]',
                 "-", tag],
                stdin=tar.stdout,
                stdout=subprocess.DEVNULL,
            )
            if tar.wait() != 0:
                raise SystemExit("tar of the debootstrap root failed")

    def build_from_recipe(self, tag, repo, recipe_hash):
        containerfile, files = KNOWN[repo]
        with tempfile.TemporaryDirectory(prefix="seckill-standin-", dir=self.cache) as tmp:
            context = Path(tmp)
            for name in files:
                shutil.copy2(RECIPES / name, context / name)
            if repo.endswith("/rust"):
                # Hard links where the cache shares the toolchain's file system: a copy of
                # 600 MB is what makes this step slow otherwise. The docs are left out.
                toolchain = rust_toolchain()
                copy = ["cp", "-a", "-l"] if same_device(toolchain, context) else ["cp", "-a"]
                (context / "toolchain").mkdir()
                for part in ["bin", "lib", "libexec", "etc"]:
                    if (toolchain / part).exists():
                        run([*copy, toolchain / part, context / "toolchain" / part])
            run(
                [*self.engine, "build", "--network", self.build_network,
                 "--label", f"{LABEL}={recipe_hash}",
                 "-f", RECIPES / containerfile, "-t", tag, context],
            )


def local_cas():
    return sorted(LOCAL_CAS.glob("*.crt")) if LOCAL_CAS.is_dir() else []


def same_device(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b).st_dev
