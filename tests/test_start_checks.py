"""One line, at the start, for what cannot work (issue 38, items 8-11 and 13): each case run as a user meets it,
the script's command line in a fresh process, ending on one line that names the problem and the fix."""

import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading

import pytest
from kiln_testing import DEBUG, REPO
from test_faults_round_two import assert_one_line_error, script_cli

# ----------------------------------------------------------------------------------------------------------
# item 11: one bad sequence in an otherwise valid UTF-8 corpus


def test_a_lone_surrogate_in_a_utf8_corpus_is_named_by_byte_offset_not_sent_through_latin1(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = "".join(
        f"第{i}章 東京の朝は静かだった 😀 שלום עולם. The cat sat on the mat.\n\n" for i in range(300)
    )
    head = text.encode("utf-8")
    path = corpus / "notes.txt"
    path.write_bytes(head + b"a lone surrogate \xed\xa0\x80 here\n\n" + text.encode("utf-8"))
    offset = len(head) + len(b"a lone surrogate ")
    line = head.count(b"\n") + 1
    quoted = shlex.quote(str(path))
    expected = (
        f"error: {path} is UTF-8 with one invalid byte sequence at byte offset {offset} (line {line}: bytes "
        f"ed a0 80, an encoded UTF-16 surrogate); do not re-encode the file (from latin1 or any other "
        f"encoding: its other non-ASCII text would be garbled): delete or fix those bytes, e.g. "
        f"`iconv -f utf-8 -t utf-8 -c {quoted} > {quoted}.clean` drops only those bytes"
    )
    status, output = script_cli(
        "pretrain/run.py",
        "--config",
        DEBUG,
        "--data.data_files",
        corpus / "*.txt",
        "--training.output_dir",
        tmp_path / "run",
        "--training.max_steps",
        1,
    )
    assert assert_one_line_error(status, output) == expected, output
    assert "latin1" not in output.replace("from latin1 or any other", "")
    # the prepare command reads the file in chunks of its own: the same line
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pretrain.data",
            "prepare",
            "--config",
            DEBUG,
            "--data.data_files",
            str(corpus / "*.txt"),
            "--output",
            str(tmp_path / "prepared"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert assert_one_line_error(done.returncode, done.stdout) == expected, done.stdout
    if shutil.which("iconv"):  # the command it names keeps every valid character and drops only the bad bytes
        subprocess.run(f"iconv -f utf-8 -t utf-8 -c {quoted} > {quoted}.clean", shell=True, check=True)
        assert (
            corpus / "notes.txt.clean"
        ).read_bytes() == head + b"a lone surrogate  here\n\n" + text.encode()


# ----------------------------------------------------------------------------------------------------------
# item 11: a key given twice in a config file


def test_a_key_given_twice_in_a_config_file_is_one_line_naming_key_file_and_lines(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text(
        f"_base_: {DEBUG}\ntraining:\n  learning_rate: 1.0e-3\n  max_steps: 2\n  learning_rate: 5.0e-4\n"
    )
    status, output = script_cli(
        "pretrain/run.py", "--config", config, "--training.output_dir", tmp_path / "run"
    )
    assert assert_one_line_error(status, output) == (
        f"error: {config}, line 5: key 'training.learning_rate' is given twice (also on line 3), and only the last "
        f"would count; keep one"
    ), output
    assert not (tmp_path / "run").exists()
    # the same key in two sections, or once in a file and once in its _base_, is no duplicate
    config.write_text(f"_base_: {DEBUG}\ntraining:\n  max_steps: 1\nlogging:\n  logging_steps: 1\n")
    from kiln.config import load_yaml

    assert load_yaml(config)["training"]["max_steps"] == 1


# ----------------------------------------------------------------------------------------------------------
# item 10: W&B online without a key or without a network


def _refused_port() -> int:
    with socket.socket() as probe:  # bound then closed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _WandbServer:
    """A loopback stand-in for the W&B API that answers every request with `status`."""

    def __init__(self, status: int):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.status = status
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(server.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def start(script: str, *args, env: dict[str, str]) -> subprocess.Popen:
    """`python SCRIPT ARGS...` started in a fresh process with exactly `env` (plus the repository on PYTHONPATH):
    several commands of one test run side by side (each is mostly start-up); `ended` waits for one."""
    env = {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, str(REPO / script), *map(str, args)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def ended(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    return proc.returncode, output


def _wandb_env(tmp_path, **settings) -> dict[str, str]:
    """No key of the machine's (an empty home and netrc), a W&B API on loopback only."""
    (tmp_path / "home").mkdir(exist_ok=True)
    env = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    return {**env, "HOME": str(tmp_path / "home"), "NETRC": str(tmp_path / "home" / "netrc"), **settings}


@pytest.mark.slow
def test_wandb_online_without_a_key_or_a_network_is_one_line_within_seconds(tmp_path):
    quick = ["--config", DEBUG, "--logging.report_to", "wandb", "--training.max_steps", 1]
    offline = "or set WANDB_MODE=offline to log to disk (`wandb sync` uploads later)"
    # online, no API key anywhere: no request at all, one line naming `wandb login`
    env = _wandb_env(tmp_path, WANDB_MODE="online", WANDB_BASE_URL=f"http://127.0.0.1:{_refused_port()}")
    no_key = start("pretrain/run.py", *quick, "--training.output_dir", tmp_path / "a", env=env)
    # a key, but the server cannot be reached (started alongside)
    url = f"http://127.0.0.1:{_refused_port()}"
    env = _wandb_env(tmp_path, WANDB_API_KEY="k" * 40, WANDB_BASE_URL=url)
    unreachable = start("pretrain/run.py", *quick, "--training.output_dir", tmp_path / "b", env=env)
    status, output = ended(no_key)
    assert assert_one_line_error(status, output) == (
        "error: --logging.report_to wandb with WANDB_MODE=online, but no W&B API key is set (WANDB_API_KEY, or "
        f"`wandb login`); run `wandb login`, {offline}"
    ), output
    assert not (tmp_path / "a").exists() and "Tokenizing" not in output  # said before anything was built
    # a key, but the server cannot be reached: one line in seconds (wandb.init took about two minutes)
    status, output = ended(unreachable)
    message = assert_one_line_error(status, output)
    assert message.startswith(f"error: the W&B server {url} does not answer (ConnectionRefusedError: "), (
        output
    )
    assert message.endswith(f"; check the network, {offline}"), output
    assert not (tmp_path / "b").exists() and "Tokenizing" not in output
    # WANDB_MODE=offline, or no key and no WANDB_MODE (Kiln logs offline then, as documented): nothing is asked
    from kiln.config import LoggingConfig
    from kiln.run_setup import wandb_problem

    for settings in ({"WANDB_MODE": "offline", "WANDB_API_KEY": "k" * 40, "WANDB_BASE_URL": url}, {}):
        with pytest.MonkeyPatch.context() as patch:
            for key, value in _wandb_env(tmp_path, **settings).items():
                patch.setenv(key, value)
            for key in {k for k in os.environ if k.startswith("WANDB_")} - set(settings):
                patch.delenv(key)
            assert wandb_problem(LoggingConfig(report_to="all")) is None


def test_a_wandb_key_from_the_netrc_file_that_the_server_refuses_is_named(tmp_path, monkeypatch):
    from kiln.config import LoggingConfig
    from kiln.run_setup import wandb_problem

    server = _WandbServer(401)
    try:
        (tmp_path / "home").mkdir()
        netrc = tmp_path / "home" / "netrc"  # what `wandb login` writes, for the server's host
        netrc.write_text(f"machine 127.0.0.1\n  login user\n  password {'n' * 40}\n")
        netrc.chmod(0o600)
        for key, value in _wandb_env(tmp_path, WANDB_MODE="online", WANDB_BASE_URL=server.url).items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("WANDB_API_KEY", raising=False)
        assert wandb_problem(LoggingConfig(report_to="wandb")) == (
            f"the W&B server {server.url} does not accept the API key (HTTP 401); run `wandb login --relogin`, or "
            f"set WANDB_MODE=offline to log to disk (`wandb sync` uploads later)"
        )
        server.status = 200
        assert wandb_problem(LoggingConfig(report_to="wandb")) is None
    finally:
        server.close()


# ----------------------------------------------------------------------------------------------------------
# item 8: the rights to push, found at the start


def test_a_run_that_may_not_push_says_so_before_anything_is_built(hub, tmp_path):
    from conftest import TEST_USER

    hub.namespaces = {TEST_USER}  # the token writes only in its own namespace, as on the Hub
    out = tmp_path / "run"
    status, output = script_cli(
        "pretrain/run.py",
        "--config",
        DEBUG,
        "--training.output_dir",
        out,
        "--training.max_steps",
        1,
        "--hub.push_to_hub",
        "--hub.model_id",
        "stranger/model",
    )
    assert assert_one_line_error(status, output).startswith(
        "error: cannot push to the Hub repo stranger/model: the token of kiln-test may not create the repo (HTTP "
        '403: You don\'t have the rights to create a model under the namespace "stranger"); pick a repo id in a '
        "namespace you can write to with --hub.model_id, or run `hf auth login` (or set HF_TOKEN) with a token that "
        "has write access there"
    ), output
    assert not out.exists() and "Tokenizing" not in output  # before the tokenizer, the data and step 1
    assert ("model", "stranger/model") not in hub.repos


def test_push_rights_at_the_start_token_namespace_existing_repo_and_role(hub):
    from conftest import TEST_USER

    from kiln.hub import check_push_rights

    hub.namespaces = {TEST_USER, "kiln-org"}
    login = "run `hf auth login` (or set HF_TOKEN) with a token that has write access"
    # a repo of its own namespace or of its organisation: created, then written
    assert check_push_rights(f"{TEST_USER}/new", private=True) == check_push_rights("kiln-org/new")
    assert check_push_rights(f"{TEST_USER}/new").refusal is None and hub.repo(f"{TEST_USER}/new").private
    # a stranger's repo that exists: readable (create_repo(exist_ok=True) passes), not writable
    hub.create_repo("stranger/existing")
    assert check_push_rights("stranger/existing").refusal == (
        "cannot push to the Hub repo stranger/existing: the token of kiln-test may not write to it (HTTP 403: You "
        "don't have the rights to write to stranger/existing); pick a repo id in a namespace you can write to with "
        f"--hub.model_id, or {login} there"
    )
    # a read-only token, in its own namespace
    hub.token_role = "read"
    assert (
        "the token of kiln-test may not create the repo (HTTP 403"
        in check_push_rights(f"{TEST_USER}/x").refusal
    )
    # a token the Hub does not know
    hub.token = "hf_someoneELSE0123456789"
    assert (
        check_push_rights(f"{TEST_USER}/x").refusal
        == f"the Hub does not accept the Hugging Face token (HTTP 401); {login}"
    )


def test_a_server_without_the_write_check_route_is_a_warning_once_the_repo_is_created(hub):
    """Older Hub-compatible servers answer create_repo but have no auth-check route: its 404, after the repo was
    created, leaves the run going (the first push tells); a 401 or 403 of the same check stays a refusal."""
    from conftest import TEST_USER

    from kiln.hub import check_push_rights

    hub.fail(only="auth_check", status=404)
    rights = check_push_rights(f"{TEST_USER}/older-server")
    assert rights.refusal is None and rights.unchecked.startswith(
        "the server has no write check (HTTP 404"
    ), rights
    assert rights.unchecked.endswith(f"for {TEST_USER}/older-server") and hub.repo(
        f"{TEST_USER}/older-server"
    )
    for status in (401, 403):
        hub.fail(only="auth_check", status=status)
        refused = check_push_rights(f"{TEST_USER}/older-server")
        assert refused.refusal and f"(HTTP {status}" in refused.refusal and not refused.unchecked, refused


def test_a_hub_that_cannot_be_asked_leaves_the_run_going(hub, tmp_path, caplog, monkeypatch):
    """Offline, failing or silent: a warning, and the run trains and pushes as before (its pushes retried)."""
    from conftest import TEST_USER
    from huggingface_hub import constants
    from kiln_testing import run

    from kiln.hub import check_push_rights, set_request_timeout

    hub.fail(status=503, times=1)  # the first request of the check: a Hub that answers with an error
    with caplog.at_level("WARNING", logger="kiln"):
        state = run(
            tmp_path / "run",
            "--training.max_steps",
            2,
            "--training.save_steps",
            0,
            "--hub.push_to_hub",
            "--hub.model_id",
            f"{TEST_USER}/later",
        )
    assert state.global_step == 2
    warned = [r.getMessage() for r in caplog.records if "could not ask the Hub" in r.getMessage()]
    assert warned == [
        f"could not ask the Hub whether this run may push to {TEST_USER}/later (HTTP 503: Injected failure (503) "
        f"for a whoami request); training goes on, and the pushes are tried and retried as it saves"
    ]
    assert "model.safetensors" in hub.files(f"{TEST_USER}/later")
    hub.stall()  # accepts and never answers: the check gives up after its timeout
    set_request_timeout(1)
    try:
        assert check_push_rights(f"{TEST_USER}/later", timeout_s=1).unchecked.startswith("ReadTimeout")
    finally:
        hub.reset(token=hub.token)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert check_push_rights(f"{TEST_USER}/later").unchecked == "HF_HUB_OFFLINE is set"


# ----------------------------------------------------------------------------------------------------------
# item 9: the shipped Hub-dataset configs without the Hub


HUB_DATASET_CONFIGS = ["classify-sst2", "classify-mrpc", "classify-stsb", "tag-conll2003", "seq2seq-multi30k"]


@pytest.mark.parametrize("name", HUB_DATASET_CONFIGS)
def test_every_shipped_hub_dataset_config_offline_names_the_dataset_and_the_local_files(
    name, monkeypatch, tmp_path
):
    from datasets import config as datasets_config
    from huggingface_hub import constants

    from finetune.data import FinetuneDataError, _load_splits
    from kiln.config import load_yaml

    data = load_yaml(REPO / "configs" / "finetune" / f"{name}.yaml")["data"]
    monkeypatch.setattr(datasets_config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))  # empty caches: nothing used before
    monkeypatch.setattr(datasets_config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    with pytest.raises(FinetuneDataError) as refused:
        _load_splits(
            data["dataset_name"], data.get("dataset_config"), {}, revision=data.get("dataset_revision")
        )
    dataset = data["dataset_name"] + (f" ({data['dataset_config']})" if data.get("dataset_config") else "")
    message = str(refused.value)
    assert message.startswith(
        f"cannot load the Hub dataset {dataset}: HF_HUB_OFFLINE is set and the datasets "
        f"cache does not hold it; run once with the network to cache it"
    ), message
    assert (
        "--data.dataset_name none with --data.train_file, --data.validation_file and --data.test_file"
        in message
    )
    twin = REPO / "configs" / "finetune" / "offline" / f"{name}.yaml"
    assert (f"(as --config configs/finetune/offline/{name}.yaml does)" in message) == twin.is_file(), message
    assert ("--data.glue_task" in message) == name.startswith("classify-"), message


@pytest.mark.slow
def test_hub_dataset_configs_and_glue_without_the_hub_end_in_one_line(kiln_checkpoints, tmp_path):
    encoder, _ = kiln_checkpoints
    # offline (HF_HUB_OFFLINE=1) with an empty cache; the configs: the test above
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    glue = start(
        "finetune/glue.py",
        "--checkpoint",
        encoder,
        "--tasks",
        "stsb",
        "--output-dir",
        tmp_path / "glue",
        env=env,
    )
    # online, with a Hub that cannot be reached (started alongside, with a cache of its own)
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf-online"),
        "HF_ENDPOINT": f"http://127.0.0.1:{_refused_port()}",
    }
    tag = start(
        "finetune/tag.py",
        "--config",
        "configs/finetune/tag-conll2003.yaml",
        "--model.checkpoint",
        encoder,
        "--training.output_dir",
        tmp_path / "ner",
        env=env,
    )
    status, output = ended(glue)
    assert assert_one_line_error(status, output) == (
        "error: cannot load the Hub dataset nyu-mll/glue (stsb): HF_HUB_OFFLINE is set and the datasets cache does "
        "not hold it; run once with the network to cache it (HF_HUB_OFFLINE=1 then reads the cache), or read local "
        "copies: --data.glue_dir DIR, the STS-B folder of the GLUE data (python finetune/glue.py: --glue-dir)"
    ), output
    # online, with a Hub that cannot be reached
    status, output = ended(tag)
    assert assert_one_line_error(status, output) == (
        "error: cannot load the Hub dataset eriktks/conll2003: the Hub cannot be reached and the datasets cache does "
        "not hold it; run once with the network to cache it (HF_HUB_OFFLINE=1 then reads the cache), or read local "
        "copies: --data.dataset_name none with --data.train_file, --data.validation_file and --data.test_file (as "
        "--config configs/finetune/offline/tag-conll2003.yaml does)"
    ), output
