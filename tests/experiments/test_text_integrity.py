"""The training text, checked where a run depends on it: a checkpoint records its sha256 and size, and a resume
on a text that changed (even with the same characters) is one line naming the file and what changed, unless
`--allow-changes`; a checkpoint of an older lazylab (without them) still resumes, with a note. A prompt with a
character the text lacks is one line naming the `prompt` key, before anything is written."""
import errno
import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lazylab import cli
from lazylab.data import DataError, TextDataset, bundled_text_path
from lazylab.experiments import checkpoint as checkpoint_module
from lazylab.experiments.checkpoint import load_checkpoint
from lazylab.experiments.nlp_autoregression import prompt_ids
from lazylab.runs import CHECKPOINT_PT as CHECKPOINT
from lazylab.testing import TINY

SHAKESPEARE = bundled_text_path().read_text(encoding='utf-8')[:20_000]


def _unfinished_run(tmp_path: Path, cli_error, monkeypatch) -> tuple[Path, Path]:
    """A run on a text file that stopped after its first checkpoint (the second could not be written): (the run
    directory, the text file)."""
    text = tmp_path / 'text.txt'
    text.write_text(SHAKESPEARE, encoding='utf-8')
    real_save, calls = checkpoint_module.torch.save, []

    def second_fails(payload, f):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_save(payload, f)
    with monkeypatch.context() as m:
        m.setattr(checkpoint_module.torch, 'save', second_fails)
        cli_error(['train', 'transformer', *TINY, f'text={text}', f'runs_dir={tmp_path / "runs"}'])
    run, = (tmp_path / 'runs' / 'transformer').iterdir()
    assert load_checkpoint(run / CHECKPOINT)['position']['step'] == 1
    return run, text


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode('utf-8')).hexdigest()


def _files(run: Path) -> dict:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob('*') if p.is_file()}


def test_a_checkpoint_records_the_texts_sha256_and_size(tmp_path, cli_error, monkeypatch):
    run, text = _unfinished_run(tmp_path, cli_error, monkeypatch)
    ck = load_checkpoint(run / CHECKPOINT)
    assert (ck['text_sha256'], ck['text_size']) == (hashlib.sha256(text.read_bytes()).hexdigest(), 20_000)


@pytest.mark.parametrize('change', ['reordered', 'longer'])
def test_resume_on_a_changed_text_with_the_same_characters_is_one_line_unless_allowed(
        tmp_path, cli_error, capsys, monkeypatch, change):
    run, text = _unfinished_run(tmp_path, cli_error, monkeypatch)
    new = {'reordered': SHAKESPEARE[10_000:] + SHAKESPEARE[:10_000], 'longer': SHAKESPEARE + SHAKESPEARE[:100]}[change]
    assert set(new) == set(SHAKESPEARE)  # the vocabulary is the same: only the sha256 and size can tell
    text.write_text(new, encoding='utf-8')
    line = (f'text {text} changed since the checkpoint: sha256 {_sha(SHAKESPEARE)[:12]}… → {_sha(new)[:12]}…, '
            f'size 20,000 → {len(new):,} bytes')
    before = _files(run)
    assert cli_error(['resume', str(run)]) == (f'{line}; resume on the data it was trained on, or --allow-changes '
                                               f'to go on with this')
    assert _files(run) == before

    assert cli.main(['resume', str(run), '--allow-changes']) == 0
    assert f'lazylab: warning: {line} (accepted: --allow-changes)' in capsys.readouterr().err.splitlines()
    info = json.loads((run / 'run.json').read_text(encoding='utf-8'))
    assert info['status'] == 'completed' and line in info['replay_changes']
    ck = load_checkpoint(run / CHECKPOINT)
    assert (ck['position']['step'], ck['text_sha256'], ck['text_size']) == (3, _sha(new), len(new))


def test_an_older_checkpoint_without_the_texts_sha256_resumes_with_a_note(tmp_path, cli_error, capsys, monkeypatch):
    run, _ = _unfinished_run(tmp_path, cli_error, monkeypatch)
    ck = torch.load(run / CHECKPOINT, weights_only=True)
    del ck['text_sha256'], ck['text_size']  # as lazylab wrote them before it recorded the text
    torch.save(ck, run / CHECKPOINT)
    assert cli.main(['resume', str(run)]) == 0
    err = capsys.readouterr().err
    assert err.splitlines() == ['lazylab: note: the checkpoint records no sha256 of its text (an older lazylab wrote '
                                f'it); only the vocabulary of {tmp_path / "text.txt"} was compared'], err
    assert json.loads((run / 'run.json').read_text(encoding='utf-8'))['status'] == 'completed'


# --- the prompt -------------------------------------------------------------------------------------------------

def test_a_text_without_the_default_prompts_characters_names_the_prompt_key(tmp_path, cli_error):
    text = tmp_path / 'lower.txt'
    text.write_text('abc def\n' * 500, encoding='utf-8')
    runs = tmp_path / 'runs'
    message = cli_error(['train', 'transformer', *TINY, f'text={text}', f'runs_dir={runs}'])
    assert message == (f"prompt='It is' (the start of the validation samples): character 'I' (position 0) is not in "
                       f"the text {text} (its 8 characters); set prompt=TEXT to characters of the text")
    assert not runs.exists()


@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet='abcI ', min_size=1, max_size=30), prompt=st.text(alphabet='abcdI ', min_size=1,
                                                                                 max_size=8))
def test_a_prompt_is_its_ids_or_an_error_naming_its_first_character_outside_the_text(text, prompt):
    data = TextDataset(text, 'T')
    missing = [(i, c) for i, c in enumerate(prompt) if c not in text]
    if not missing:
        assert data.tokenizer.decode(prompt_ids(data, prompt)) == prompt
        return
    i, c = missing[0]
    with pytest.raises(DataError, match=re.escape(f'prompt={prompt!r} (the start of the validation samples): '
                                                  f'character {c!r} (position {i}) is not in the text T')):
        prompt_ids(data, prompt)
