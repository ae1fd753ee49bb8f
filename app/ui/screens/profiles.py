"""The profile picker: every profile with its model pair and quantization."""
from __future__ import annotations

from typing import TYPE_CHECKING

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from app.ui.labels import profile_pair
from app.ui.screens.dialog import Dialog
from engine.text_safety import inert

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile, Profiles


def profile_option(profile: "ModelProfile", *, current: bool, default: bool, unavailable: str | None = None,
                   download: str | None = None) -> Option:
    """One line with the name and badges, one with the pair, one with the description;
    an unavailable profile says why and cannot be picked; one that downloads first says how
    much (``download``). Names and descriptions come from models files: shown, never obeyed
    (:func:`~engine.text_safety.inert`)."""
    badges = []
    if current:
        badges.append(("  ● current", "$text-success"))
    if default:
        badges.append(("  default", "$text-muted"))
    k = "adaptive K" if profile.k is None else f"K={profile.k}"
    if profile.backend == "server":
        k = "drafting and K set by the server"
    prompt = Content.assemble(
        (inert(profile.name), "bold"),
        *badges,
        "\n  ",
        inert(profile_pair(profile)),
        (f"  · {k}" if profile.backend == "server" else f"  · {profile.drafter} · {k}", "$text-muted"),
    )
    if profile.description:
        prompt = Content.assemble(prompt, "\n  ", (inert(profile.description), "$text-muted italic"))
    if unavailable:
        prompt = Content.assemble(prompt, "\n  ", (inert(f"unavailable: {unavailable}"), "$text-error"))
    elif download:
        prompt = Content.assemble(prompt, "\n  ", (f"first use downloads {download}", "$text-warning"))
    return Option(prompt, id=profile.name, disabled=unavailable is not None)


class ProfilePicker(Dialog["str | None"]):
    """Pick a profile; dismisses with its name, or None."""

    def __init__(self, profiles: "Profiles", current: str | None,
                 unavailable: "dict[str, str] | None" = None, downloads: "dict[str, str] | None" = None,
                 highlight: str | None = None) -> None:
        super().__init__()
        self._profiles = profiles
        self._current = current
        self._highlight = current or highlight
        """The row highlighted first: the loaded profile, else the one last asked for (a load just
        stopped or failed); the first row was highlighted instead, and after Esc stopped pocket's
        load, F2 and Enter started coder's 1.6 GB download."""
        self._unavailable = dict(unavailable or {})
        """Profile name -> why it cannot run on this machine."""
        self._downloads = dict(downloads or {})
        """Profile name -> what its first load downloads."""

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog picker-dialog"):
            yield Label("Switch profile", classes="dialog-title")
            yield Label("Enter loads it (the current models stay until it is ready) · Esc cancels",
                        classes="dialog-hint")  # within 80 columns
            options = [
                profile_option(
                    self._profiles.get(name),
                    current=name == self._current,
                    default=name == self._profiles.default,
                    unavailable=self._unavailable.get(name),
                    download=self._downloads.get(name),
                )
                for name in self._profiles.names()
            ]
            yield OptionList(*options, id="profile-list")

    def on_mount(self) -> None:
        option_list = self.query_one(OptionList)
        if self._highlight in self._profiles.names():
            option_list.highlighted = self._profiles.names().index(self._highlight)
            # the current profile at the top, its description whole (at 80x24 it sat on the bottom row, cut)
            self.call_after_refresh(option_list.scroll_to_highlight, top=True)
        option_list.focus()

    def picked(self, option: Option) -> None:
        self.dismiss(option.id)

