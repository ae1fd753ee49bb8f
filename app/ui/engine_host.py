"""The engine host: which profiles there are, which one is loaded, and its backend.

A plain object the App owns. It keeps the state of the loaded engine
(``profiles``, ``profile``, ``backend``, ``loading``) and answers the questions
the screens ask of it; the App runs :meth:`load` in a worker thread and posts
its answer. ``lock`` is held while a reply iterates the backend and while a
load replaces it, so a switch closes a backend only once its reply stopped.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.store.state import last_profile, remember_profile
from app.ui.loading import Loader, default_loader, load_beside
from app.ui.messages import EngineFailed, EngineReady
from engine.api import ChatBackend, EngineInfo
from engine.progress import ProgressFn
from engine.errors import SpecChatError
from engine.events import NOT_PAYING

if TYPE_CHECKING:
    from engine.config.profiles import ModelProfile, Profiles




@dataclass(frozen=True)
class Refusal:
    """Why the host will not do what was asked, worded for a notice."""

    text: str
    severity: str = "warning"
    title: str = ""


@dataclass(frozen=True)
class ProfileChoice:
    """Where the first profile comes from: ``--server``, ``--target``/``--draft``, a name, or the default."""

    name: str | None = None
    models_file: Path | None = None
    target: str | None = None
    draft: str | None = None
    server_profile: "ModelProfile | None" = None


class EngineHost:
    """Profiles, the loaded backend and the speculation toggle (used on the UI thread,
    except :meth:`load`, which runs in a worker)."""

    def __init__(self, choice: ProfileChoice, *, memory_budget: int | None = None, loader: Loader | None = None,
                 profiles_loader: "Callable[[], Profiles] | None" = None) -> None:
        self.choice = choice
        self.memory_budget = memory_budget
        self.loader: Loader = loader or default_loader
        self._profiles_loader = profiles_loader or self._load_profiles_file
        self.profiles: "Profiles | None" = None
        self.profile: "ModelProfile | None" = None
        self.backend: ChatBackend | None = None
        self.loading = False
        self.speculation_on = True
        self.speculation_forced = False
        """Switched on by hand over an automatic switch-off (the engine no longer steps aside)."""
        self.last_toggle: tuple[bool, bool] = (True, False)
        """What the last toggle found: speculation on, and off by itself (:data:`NOT_PAYING`)."""
        self.off_by_user = False
        """F5 switched speculation off, and it stays off through a profile switch or a reload until
        F5 again (it came back on with every load, unsaid, against F5's own notice)."""
        self.lock = threading.Lock()
        self._cuda: bool | None = None
        self._stop_load = threading.Event()
        """Set by :meth:`stop_loading`: the load under way gives up (a fresh one for each load)."""
        self._quitting = threading.Event()
        """Set as the app closes: it stops even a load Esc does not (the way back to the old pair)."""
        self._given: "ModelProfile | None" = None
        """The command line's profile, built once (:meth:`_given_profile`)."""
        self._replaced: ChatBackend | None = None
        """The backend a load under way replaces (closed by the load, or kept if it fails): closed on exit."""

    def _load_profiles_file(self) -> "Profiles":
        from engine.config.models_file import load_profiles

        return load_profiles(self.choice.models_file)

    # -- which profile --------------------------------------------------------------

    def read_profiles(self) -> Refusal | None:
        """Read the profiles file(s); a Refusal says why they could not be read, or (a warning, the
        profiles read) which of the user's profiles are left out and why."""
        try:
            self.profiles = self._profiles_loader()
        except SpecChatError as exc:
            return Refusal(str(exc), "error", "Profiles")
        except Exception as exc:  # never a traceback in the UI
            return Refusal(f"Could not read profiles: {type(exc).__name__}: {exc}", "error")
        try:
            given = self._given_profile()
        except SpecChatError:  # said by initial_profile
            given = None
        if given is not None and self.profiles is not None and given.name not in self.profiles.names():
            # listed in F2 beside the files' own (not over one of the same name): a --server whose
            # server was down at the start could not be connected again without quitting
            self.profiles = dataclasses.replace(self.profiles, profiles={**self.profiles.profiles, given.name: given})
        notices = getattr(self.profiles, "notices", ())
        return Refusal("\n".join(notices), "warning", "Profiles") if notices else None

    def _given_profile(self) -> "ModelProfile | None":
        """The profile the command line builds (``--server``, ``--target``/``--draft``), None without one;
        a :class:`SpecChatError` when it cannot be built. One object, so that F2 names it as the loaded one."""
        choice = self.choice
        if self._given is None and (choice.server_profile is not None or choice.target is not None):
            from engine.config.profiles import profile_from_sources

            self._given = choice.server_profile or profile_from_sources(choice.target or "", choice.draft)
        return self._given

    def initial_profile(self) -> "ModelProfile | Refusal | None":
        """The profile to load first: --server, --target/--draft, the named one, the one
        used last (remembered in the user state dir), or the default."""
        choice = self.choice
        try:
            given = self._given_profile()
            if given is not None:
                return given
            if self.profiles is not None:
                name = choice.name
                if name is None and last_profile() in self.profiles.names():
                    name = last_profile()
                return self.profiles.get(name)
        except SpecChatError as exc:
            return Refusal(str(exc), "error", "Profile")
        return None

    def unavailable_profiles(self) -> dict[str, str]:
        """Profile name -> why it cannot run on this machine (CUDA checked once)."""
        if self.profiles is None:
            return {}
        from engine.load.availability import cuda_present, unavailable_reason

        if self._cuda is None:
            self._cuda = cuda_present()
        reasons = {name: unavailable_reason(self.profiles.get(name), cuda=self._cuda) for name in self.profiles.names()}
        return {name: why for name, why in reasons.items() if why}

    def download_of(self, profile: "ModelProfile") -> str | None:
        """What ``profile``'s first load downloads (``about 6.20 GB``), None when its models are in the
        cache (always None with a loader other than :func:`~app.ui.loading.default_loader`: the cache
        is that one's)."""
        if self.loader is not default_loader:
            return None
        from engine.fetch.inventory import to_download

        fetch = to_download(profile)
        return fetch.words() if fetch.sources else None

    def downloads(self) -> dict[str, str]:
        """Profile name -> :meth:`download_of`, for the profiles not in the cache."""
        if self.profiles is None:
            return {}
        found = {name: self.download_of(self.profiles.get(name)) for name in self.profiles.names()}
        return {name: words for name, words in found.items() if words is not None}

    def switch_target(self, name: str) -> "ModelProfile | Refusal":
        """The profile ``name`` if a switch to it may start now, else why not."""
        if self.profiles is None:
            return Refusal("No profiles are available.")
        if self.loading:
            loading = self.profile.name if self.profile is not None else "A profile"
            return Refusal(f"{loading} is still loading: Esc stops it, then F2 picks another.")
        try:
            profile = self.profiles.get(name)
        except SpecChatError as exc:
            return Refusal(str(exc), "error", "Profile")
        why_not = self.unavailable_profiles().get(profile.name)
        if why_not:
            return Refusal(f"{profile.name} cannot run here: {why_not}.", title="Profile unavailable")
        if self.profile is not None and profile.name == self.profile.name and self.backend_alive:
            return Refusal(f"{name} is already loaded.", "information")
        return profile

    # -- loading ----------------------------------------------------------------------

    @property
    def backend_alive(self) -> bool:
        """A backend is loaded and still runs (an engine process that was killed or crashed does not)."""
        return self.backend is not None and getattr(self.backend, "alive", True)

    def begin_load(self, profile: "ModelProfile") -> "tuple[ChatBackend | None, ModelProfile | None]":
        """Mark ``profile`` as loading; answers the backend it replaces and that backend's profile
        (none for a backend whose process died: it is let go of here, and nothing falls back on it)."""
        if self.backend is not None and not self.backend_alive:
            dead, self.backend = self.backend, None
            try:
                dead.close()
            except Exception:  # noqa: BLE001 - its process is gone already
                pass
        old, self.backend = self.backend, None
        old_profile = self.profile if old is not None else None
        self.profile = profile
        self.loading = True
        self._stop_load = threading.Event()
        self._replaced = old
        return old, old_profile

    def stop_loading(self) -> bool:
        """Stop the load under way (Esc): its process and downloads end, the models loaded
        before stay (:func:`app.ui.loading.load_beside`). Answers whether a load was under way."""
        if not self.loading or self._stop_load.is_set():
            return False
        self._stop_load.set()
        return True

    def load(self, profile: "ModelProfile", old: ChatBackend | None, old_profile: "ModelProfile | None",
             progress: ProgressFn) -> EngineReady | EngineFailed:
        """Load ``profile`` beside ``old`` (:func:`app.ui.loading.load_beside`), once any reply on the
        old backend has stopped. Runs in a worker thread."""
        stop = self._stop_load
        with self.lock:
            return load_beside(self.loader, self.memory_budget, profile, old, old_profile, progress, stop,
                               quitting=self._quitting)

    def ready(self, backend: ChatBackend, profile: "ModelProfile") -> None:
        """A load finished: ``backend`` serves ``profile``, speculating unless F5 switched it off."""
        self.loading = False
        self._replaced = None
        self.backend, self.profile = backend, profile
        self.speculation_on, self.speculation_forced = True, False
        if self.off_by_user:
            try:
                backend.set_speculation(False)
            except SpecChatError:
                self.off_by_user = False  # it speculates; the HUD says so
            else:
                self.speculation_on = backend.info.mode != "plain"
        if self.profiles is not None and profile.name in self.profiles.names() and profile is not self._given:
            remember_profile(profile.name)  # not a --target/--server pair made on the fly

    def failed(self, restored: "tuple[ChatBackend, ModelProfile] | None") -> None:
        """A load failed; ``restored`` is the pair still (or again) loaded, if any."""
        self.loading = False
        self._replaced = None
        if restored is not None:
            self.backend, self.profile = restored

    # -- the loaded engine ------------------------------------------------------------

    def toggle_speculation(self) -> tuple[bool, EngineInfo]:
        """Turn speculation off if the engine speculates, else on; answers whether it was on
        and the engine's info after. Reads the engine's mode, so after an automatic
        switch-off the first toggle turns it on (forced on: the engine no longer switches
        it off on evidence, :mod:`engine.decode.auto_switch`). Raises SpecChatError from the backend."""
        assert self.backend is not None
        before = self.backend.info
        was_on = before.mode != "plain"
        self.backend.set_speculation(not was_on)
        info = self.backend.info
        self.speculation_on = info.mode != "plain"
        self.speculation_forced = self.speculation_on and before.off_reason == NOT_PAYING
        self.last_toggle = (was_on, before.off_reason == NOT_PAYING)
        if was_on != self.speculation_on:
            self.off_by_user = not self.speculation_on
        return was_on, info

    def toggle_words(self, info: EngineInfo) -> tuple[str, str]:
        """What the last :meth:`toggle_speculation` did, in terms of the state the user saw
        before it (on, off by hand, or off by itself), and the notice's severity."""
        was_on, auto_off = self.last_toggle
        if self.speculation_on and auto_off:
            return ("Speculation was off (automatic: not paying here); now forced on until you press F5 again.",
                    "information")
        if self.speculation_on:
            return "Speculation on: it steps aside by itself where it does not pay.", "information"
        if was_on:
            return "Speculation off (by you): plain decoding until you press F5 again.", "information"
        return (f"Speculation cannot be switched on: {info.fallback_reason or 'no drafter is loaded'}.", "warning")

    def interrupt(self) -> None:
        """Stop the reply in the engine at once, where the backend can (safe from any thread:
        Esc on the terminal's input thread); the reply's own cancel flag does the rest."""
        stop = getattr(self.backend, "interrupt", None)
        if stop is not None:
            stop()

    def yield_to_ui(self, seconds: float | None = None) -> bool:
        """The engine leaves the UI a core for ``seconds`` (None: the backend's own moment),
        from its next round on: a key, click or scroll arrived (on the terminal's input
        thread), so what it changes shows at once, or a paint is about to start
        (:data:`app.ui.pacing.PAINT_YIELD_S`). False when the backend cannot be asked (a
        remote server, a stand-in); the child itself keeps every thread where a core is free."""
        give = getattr(self.backend, "yield_to_ui", None)
        if give is None:
            return False
        if seconds is None:
            give()
        else:
            give(seconds)
        return True

    @property
    def drafts_from_history(self) -> bool:
        """The loaded profile's drafter drafts from earlier chats (the suffix drafter)."""
        return self.backend is not None and self.profile is not None and self.profile.drafter == "suffix"

    def learn(self, texts: list[str]) -> str | None:
        """Hand the backend earlier chats' messages (run in a worker: tokenizing and indexing
        take up to a second); answers what went wrong, worded for a notice, or None."""
        backend = self.backend
        if backend is None:
            return None
        try:
            backend.learn(texts)
        except Exception as exc:  # noqa: BLE001 - drafting goes on from the open chat alone
            return f"Earlier chats are not used for drafting: {exc}"
        return None

    def close(self) -> None:
        """Close the backend (waiting for a reply that still holds it); a load under way is stopped
        first (its process and downloads end: quitting waited for a whole load, on a blank screen),
        and the pair it was replacing is closed too."""
        self._quitting.set()
        self._stop_load.set()
        for backend in (self.backend, self._replaced):  # during a switch a reply may still end on the old pair
            closing = getattr(backend, "closing", None)
            if closing is not None:  # a reply's child that does not end it soon is ended, the reply not failed
                closing()  # (engine.child.backend): a stopped one kept ctrl+q waiting STOP_WAIT_S, 10 s
            stop = getattr(backend, "interrupt", None)
            if stop is not None:  # a reply that holds the lock ends, or its hung child is ended
                stop()
        with self.lock:
            for backend in (self.backend, self._replaced):
                if backend is not None:
                    try:
                        backend.close()
                    except Exception:  # exiting anyway
                        pass
            self.backend = self._replaced = None
