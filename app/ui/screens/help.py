"""Help: every key binding, generated from the bindings themselves."""
from __future__ import annotations

from collections.abc import Iterable

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Markdown

from app.ui.screens.dialog import Dialog

ALPHA_TERM = (
    "**α**: the chance that a drafted token is accepted, given that the ones before it were "
    "(accepted ÷ draft positions reached; the α of τ = (1 − α^(K+1)) / (1 − α)); the HUD shows it as "
    "α/token. Its **accepted** row is another figure: accepted ÷ proposed, which falls as K grows."
)
"""α in the words the README's "Terms" uses too (tests/app/ui/test_names.py keeps them equal)."""

INTRO = f"""\
# specchat keys

A draft model (or a lookup) proposes **K** tokens, the target verifies them
in one pass: the reply is exactly the target's, only faster. The HUD shows
α, **τ** (tokens per target pass), tokens/s, inter-token latency and the
**measured** speedup over plain decoding, with its standard error.

{ALPHA_TERM}

Everything below is also in the command palette (**ctrl+p**).

## The HUD's figures

| Figure | What it is |
|---|---|
| **K** | tokens drafted a round; "adaptive" picks it each round from the costs and acceptance measured |
| **accepted** | accepted ÷ proposed drafts (α is per position, above) |
| **τ** | the reply's tokens ÷ the target's passes: 1.00 is plain decoding's |
| **speedup** | tok/s ÷ plain decoding's tok/s on this machine, measured, ± its standard error; "too short to measure" below 32 tokens, 8 drafting rounds or 8 timed plain steps, "too uncertain to measure" when its standard error is over a quarter of it |
| **plain** | the plain tok/s the speedup divides by ("est"), and beside it what the reply's own plain (K=0) rounds measured |
| **ITL** | inter-token latency: the reply's decoding time ÷ its tokens |
| **chat / model / earlier** | per drafter of the reply: its acceptance, τ and rounds (a copy from this chat, the draft model, earlier chats) |
| **acceptance by draft position** | of the rounds that reached draft position i, the share whose i-th draft was accepted |
| **lookup on 72% · plain 28%** | the share of the reply's tokens decoded with drafting on and off: the engine steps aside where drafting does not pay ("not paying here"; F5 forces it on) |
| **F4's colours** | each token by where it came from: a draft the target accepted, or the target's own (suffix drafting also marks drafts copied from this chat and from earlier chats); the HUD's legend names each colour |

## Where files live

Chats (`history.db`) and F9's exports in the data folder, the engine's log in the state folder,
models in the cache folder, your own profiles (`models.toml`) in the config folder: `specchat
profiles` prints the config file's path, `specchat models` the cache's, and README's "Where your
files are" the rest, with the variables that move them (`SPECCHAT_DATA_DIR`, `SPECCHAT_STATE_DIR`,
`SPECCHAT_CACHE_DIR`, `SPECCHAT_CONFIG_DIR`).
"""


def _rows(bindings: Iterable[BindingType]) -> list[tuple[str, str]]:
    rows = []
    for b in bindings:
        if not isinstance(b, Binding) or not b.description:
            continue
        keys = " ".join(f"`{k.strip()}`" for k in b.key.split(","))
        rows.append((keys, b.description if not b.tooltip else f"{b.description}: {b.tooltip}"))
    return rows


def help_markdown(sections: Iterable[tuple[str, Iterable[BindingType]]]) -> str:
    """The help text: the intro, then one table per section of bindings."""
    parts = [INTRO]
    for title, bindings in sections:
        rows = _rows(bindings)
        if not rows:
            continue
        parts.append(f"\n## {title}\n\n| Key | Action |\n|---|---|")
        parts.extend(f"| {key} | {desc} |" for key, desc in rows)
    return "\n".join(parts) + "\n"


class HelpScreen(Dialog[None]):
    """A dismissable page of key bindings."""

    BINDINGS = [Binding("q", "cancel", "Close")]  # F1 too: the app's F1 closes the help it opened

    def __init__(self, sections: list[tuple[str, list[BindingType]]]) -> None:
        super().__init__()
        self._sections = sections
        self.markdown = help_markdown(sections)
        """The page's text."""

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body", classes="dialog"):
            yield Markdown(self.markdown)
