"""One line, at the start, for what cannot work (issue 38, items 8-11 and 13): each case run as a user meets it,
the script's command line in a fresh process, ending on one line that names the problem and the fix."""

import os
import shlex
import shutil
import subprocess
import sys

from kiln_testing import DEBUG, REPO
from test_faults_round_two import assert_one_line_error, script_cli

# ----------------------------------------------------------------------------------------------------------
# item 11: one bad sequence in an otherwise valid UTF-8 corpus


def test_a_lone_surrogate_in_a_utf8_corpus_is_named_by_byte_offset_not_sent_through_latin1(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = "".join(f"第{i}章 東京の朝は静かだった 😀 שלום עולם. The cat sat on the mat.\n\n" for i in range(300))
    head = text.encode("utf-8")
    path = corpus / "notes.txt"
    path.write_bytes(head + b"a lone surrogate \xed\xa0\x80 here\n\n" + text.encode("utf-8"))
    offset = len(head) + len(b"a lone surrogate ")
    line = head.count(b"\n") + 1
    quoted = shlex.quote(str(path))
    expected = (f"error: {path} is UTF-8 with one invalid byte sequence at byte offset {offset} (line {line}: bytes "
                f"ed a0 80, an encoded UTF-16 surrogate); do not re-encode the file (from latin1 or any other "
                f"encoding: its other non-ASCII text would be garbled): delete or fix those bytes, e.g. "
                f"`iconv -f utf-8 -t utf-8 -c {quoted} > {quoted}.clean` drops only those bytes")  # fmt: skip
    status, output = script_cli("pretrain/run.py", "--config", DEBUG, "--data.data_files", corpus / "*.txt",
                                "--training.output_dir", tmp_path / "run", "--training.max_steps", 1)  # fmt: skip
    assert assert_one_line_error(status, output) == expected, output
    assert "latin1" not in output.replace("from latin1 or any other", "")
    # the prepare command reads the file in chunks of its own: the same line
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "pretrain.data", "prepare", "--config", DEBUG, "--data.data_files",
                           str(corpus / "*.txt"), "--output", str(tmp_path / "prepared")], cwd=REPO, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)  # fmt: skip
    assert assert_one_line_error(done.returncode, done.stdout) == expected, done.stdout
    if shutil.which("iconv"):  # the command it names keeps every valid character and drops only the bad bytes
        subprocess.run(f"iconv -f utf-8 -t utf-8 -c {quoted} > {quoted}.clean", shell=True, check=True)
        assert (corpus / "notes.txt.clean").read_bytes() == head + b"a lone surrogate  here\n\n" + text.encode()


# ----------------------------------------------------------------------------------------------------------
# item 11: a key given twice in a config file


def test_a_key_given_twice_in_a_config_file_is_one_line_naming_key_file_and_lines(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text(f"_base_: {DEBUG}\ntraining:\n  learning_rate: 1.0e-3\n  max_steps: 2\n"
                      f"  learning_rate: 5.0e-4\n")  # fmt: skip
    status, output = script_cli("pretrain/run.py", "--config", config, "--training.output_dir", tmp_path / "run")
    assert assert_one_line_error(status, output) == (
        f"error: {config}, line 5: key 'training.learning_rate' is given twice (also on line 3), and only the last "
        f"would count; keep one"
    ), output
    assert not (tmp_path / "run").exists()
    # the same key in two sections, or once in a file and once in its _base_, is no duplicate
    config.write_text(f"_base_: {DEBUG}\ntraining:\n  max_steps: 1\nlogging:\n  logging_steps: 1\n")
    from kiln.config import load_yaml

    assert load_yaml(config)["training"]["max_steps"] == 1
