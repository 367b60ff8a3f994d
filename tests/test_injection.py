"""No value from a manifest, an inventory or the command line becomes an option or a line of another program.

git: ``--git-mirror`` values and repositories are URLs of the kinds the kit allows, every positional value
follows ``--``, and git's own transport list is restricted, so a value that slipped past the first check still
cannot name ``ext::`` or an option (each case asserts its canary file is never written).
Slurm: one table checks every setting before a batch script, srun option or multi-prog line is rendered.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from repro.cli import cli
from repro.errors import BuildError, InputError, UsageError
from repro.spec.hosts import load_hosts
from repro.images.source import fetch_commit, git, parse_mirror, repository_url
from repro.run.schedulers import parse_spec
from repro.spec.scheduler import SETTINGS, problems, seconds
from repro.run.schedulers.slurm import render_sbatch

COMMIT = "0" * 40


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, list(args), prog_name="repro")
    return res.exit_code, res.output


# --- git -------------------------------------------------------------------------------------------------

def test_a_mirror_that_is_an_option_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    for command in ("check", "images"):
        code, out = invoke(command, "paddle-rn50-v100", "--git-mirror",
                           f"https://github.com/=--upload-pack=touch {canary};")
        assert code == 2, out
        assert "is not an https://, ssh:// or file:// URL or an absolute path" in out
    assert not canary.exists()


@pytest.mark.parametrize("mirror", ["https://github.com/=/srv/git/", "https://github.com/=file:///srv/git/",
                                    "https://github.com/=ssh://git@mirror.example/", "x=https://mirror.example/g/"])
def test_mirrors_of_the_allowed_kinds_pass(mirror: str) -> None:
    assert parse_mirror(mirror) == tuple(mirror.split("=", 1))


@pytest.mark.parametrize("url", ["-u", "--upload-pack=x", "ext::sh -c x", "fd::3", "git://example/x",
                                 "http://example/x", "relative/path", "https://example/a b", "/srv/x\nnext"])
def test_mirrors_of_any_other_kind_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="is not an https://"):
        parse_mirror(f"https://github.com/={url}")
    with pytest.raises(BuildError, match="is not an https://"):
        repository_url(url)


def test_git_itself_refuses_a_transport_helper_and_an_option_as_url(tmp_path: Path) -> None:
    """Below the URL check: the kit's git calls allow only https, ssh and file, and take URLs after ``--``."""
    canary = tmp_path / "canary"
    repo = tmp_path / "r"
    git(["init", "-q", "--", str(repo)])
    with pytest.raises(BuildError, match="transport 'ext' not allowed"):
        git(["fetch", "-q", "--", f"ext::sh -c touch% {canary}", "HEAD"], cwd=repo)
    with pytest.raises(BuildError):
        git(["fetch", "-q", "--", f"--upload-pack=touch {canary};", "HEAD"], cwd=repo)
    assert not canary.exists()


def test_fetching_a_commit_from_an_option_shaped_repository_runs_nothing(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    with pytest.raises(BuildError, match="is not an https://"):
        fetch_commit(f"--upload-pack=touch {canary};", COMMIT, tmp_path / "dest")
    assert not canary.exists()


def test_a_local_mirror_still_fetches_by_commit(tmp_path: Path) -> None:
    src = tmp_path / "src"
    subprocess.run(["git", "init", "-q", str(src)], check=True)
    subprocess.run(["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    fetch_commit(str(src), head, tmp_path / "dest")
    assert (tmp_path / "dest" / ".git").is_dir()


# --- Slurm settings --------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [("30", 1800), ("1:30", 90), ("2:00:00", 7200), ("1-0", 86400),
                                           ("1-2:3", 93780), ("1-2:3:4", 93784), ("UNLIMITED", None)])
def test_slurm_times(text: str, expected: int | None) -> None:
    assert seconds(text) == expected


@pytest.mark.parametrize("key,value,why", [
    ("time", "-1", "is not a Slurm time"), ("time", "abc", "is not a Slurm time"),
    ("time", "0", "is not a positive time limit"), ("time", "0:00:00", "is not a positive time limit"),
    ("account", "bench --export=ALL,LD_PRELOAD=/tmp/x.so", "is not one word"),
    ("partition", "gpu\n#SBATCH --wrap=x", "is not one word"), ("partition", "-p", "that starts with a letter or digit"), ("partition", "-", "is not one word"),
    ("qos", "a;b", "is not one word"), ("reservation", "$(id)", "is not one word"),
    ("constraint", "v100\ntouch /tmp/x", "where &, | or a closing bracket belongs"),
    ("constraint", "v100 ib", "where &, | or a closing bracket belongs"),
    ("constraint", "v100&", "ends where a feature name"), ("constraint", "[a|b", "ends where"),
    ("constraint", "(a]", "unmatched"), ("constraint", "a&&b", "where a feature name belongs"),
    ("exclude", "node1 node2", "is not a Slurm host list"), ("container", "singularity", "is not one of docker, pyxis, apptainer"),
    ("queue", "gpu", "is not a scheduler setting"),
])
def test_slurm_values_that_could_add_a_line_or_an_option_are_refused(key: str, value: str, why: str | None) -> None:
    found = problems({key: value})
    if why is None:  # '-p' is a word Slurm may take as a name; it follows '=' in the script, never an option
        assert found == []
        return
    assert len(found) == 1 and found[0][0] == key and why in found[0][1], found


@pytest.mark.parametrize("key,value", [("partition", "gpu,debug"), ("constraint", "v100"),
                                       ("constraint", "v100&ib|(a100*2&ib)"), ("constraint", "[rack1*2&rack2*4]"),
                                       ("exclude", "node[3-4,7],gpu-9"), ("time", "UNLIMITED"), ("time", "30")])
def test_slurm_values_of_slurms_own_grammar_pass(key: str, value: str) -> None:
    assert problems({key: value}) == []


@pytest.mark.parametrize("key", list(SETTINGS))
def test_every_setting_matches_its_whole_value(key: str) -> None:
    """The example passes; the same value with a trailing newline, a trailing space or a leading space does not
    (a regular expression ending in ``$`` matches before a final newline)."""
    setting = SETTINGS[key]
    whole = [setting.example] if not setting.many else [{"export": "NCCL_IB_HCA"}.get(key, "--signal=B:USR1@120")]
    assert problems({key: whole if setting.many else whole[0]}) == []
    for bad in (whole[0] + "\n", whole[0] + " ", " " + whole[0]):
        found = problems({key: [bad] if setting.many else bad})
        assert len(found) == 1 and found[0].key == key, (bad, found)
    assert problems({"time": "2:00:00\n"})[0].why.endswith("is not a Slurm time (M, M:S, H:M:S, D-H, D-H:M, "
                                                            "D-H:M:S, or UNLIMITED)")


def test_names_digests_and_urls_are_matched_whole() -> None:
    """Each check that ends in ``$`` also refuses the value with a final newline."""
    from repro.images.refs import check_digest
    with pytest.raises(UsageError, match="is not a sha256 digest"):
        check_digest("sha256:" + "0" * 64 + "\n", "x")
    with pytest.raises(BuildError, match="is not an https://"):
        repository_url("https://github.com/x/y\n")
    with pytest.raises(ValueError, match="is not an https://"):
        parse_mirror("https://github.com/=/srv/git\n")


def test_the_command_line_and_the_inventory_are_checked_alike(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"--scheduler account: 'a b' is not one word"):
        parse_spec("slurm:account=a b")
    with pytest.raises(UsageError, match=r"--scheduler time: '-1' is not a Slurm time"):
        parse_spec("slurm:time=-1")
    hosts = tmp_path / "slurm.yaml"
    hosts.write_text(yaml.safe_dump({"schema_version": 1, "scheduler": {
        "kind": "slurm", "partition": "gpu", "constraint": "v100\ntouch /tmp/x", "time": "abc"}}))
    with pytest.raises(InputError) as e:
        load_hosts(hosts)
    text = str(e.value)
    assert f"{hosts}:2: scheduler.constraint:" in text and "scheduler.time: 'abc' is not a Slurm time" in text


def test_plan_preflight_and_up_refuse_a_bad_setting_with_exit_2(tmp_path: Path) -> None:
    hosts = tmp_path / "slurm.yaml"
    hosts.write_text("schema_version: 1\nscheduler: {kind: slurm, partition: 'gpu --wrap=id'}\n")
    for args in (["plan", "torch-rn50-cpu", "--hosts", str(hosts)],
                 ["preflight", "--hosts", str(hosts)],
                 ["up", "torch-rn50-cpu", "--hosts", str(hosts)],
                 ["plan", "torch-rn50-cpu", "--scheduler", "slurm:time=abc"],
                 ["preflight", "--scheduler", "slurm:time=-1"]):
        code, out = invoke(*args)
        assert code == 2, (args, out)
        assert "Traceback" not in out and ("scheduler.partition" in out or "--scheduler time" in out), out


def test_a_batch_script_never_holds_an_unchecked_value() -> None:
    assert render_sbatch({"partition": "gpu", "qos": "high", "exclude": "n[1-2]"}, "j", 2).splitlines()[6:9] == [
        "#SBATCH --partition=gpu", "#SBATCH --qos=high", "#SBATCH --exclude=n[1-2]"]
    with pytest.raises(UsageError, match="constraint"):
        render_sbatch({"constraint": "a\nrm -rf /"}, "j", 1)
