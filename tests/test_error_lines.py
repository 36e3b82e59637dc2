"""One-line errors quote a library's message by whole sentences (never cut mid-sentence), and name a setting as the
flag a user types (`--data.label_column`), not half of it."""

from kiln.errors import as_flag, first_line

# huggingface_hub's message when neither the Hub nor the cache has a file (as a run from a Hub id sees it offline)
HUB_OFFLINE = (
    "An error happened while trying to locate the file on the Hub and we cannot find the requested files in the local "
    "cache. Please check your connection and try again or make sure your Internet connection is on.\n"
    "(Further details follow on the next line.)"
)


def test_a_long_library_message_is_cut_at_a_sentence_end():
    quoted = first_line(OSError("Cannot load someone/bert-tiny: " + HUB_OFFLINE))
    assert quoted == (
        "Cannot load someone/bert-tiny: An error happened while trying to locate the file on the Hub and we cannot "
        "find the requested files in the local cache."
    )
    assert "Internet connection" not in quoted and len(quoted) <= 200
    # a short first line is quoted whole; a first sentence longer than the limit is cut at a word, marked so
    assert first_line(OSError("No such file. Check the path.\nmore")) == "No such file. Check the path."
    endless = first_line(ValueError("word " * 100))
    assert endless.endswith("word...") and len(endless) <= 200
    assert first_line(KeyError()) == "KeyError"


def test_a_setting_is_named_as_its_flag():
    assert as_flag("data.label_column") == "--data.label_column"
    assert as_flag("--data.label_column") == "--data.label_column"
