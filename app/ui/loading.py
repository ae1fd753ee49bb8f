"""Loading a profile's models: the worker, its progress, and switching profiles in place.

Local profiles load in the engine's child process (:mod:`engine.child`), server
profiles connect here. A switch loads the new pair next to the old one and
closes the old one only once the new one is ready (or first, when the memory
plan says they do not fit together).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from textual import work

from app.store.state import remember_profile
from app.ui.conversation import profile_pair
from app.ui.formatting import plan_lines
from app.ui.messages import EngineFailed, EngineReady, LoadProgress
from engine.api import ChatBackend, ProgressFn
from engine.errors import SpecChatError

if TYPE_CHECKING:
    from app.ui.app import SpecChatApp
    from engine.profiles import ModelProfile

ENGINE_LOG = "engine.log"


def default_loader(profile: "ModelProfile", memory_budget: int | None, progress: ProgressFn) -> ChatBackend:
    """Load the engine for real (seconds to minutes; runs in a worker thread).

    Local models load in a child process (:mod:`engine.child`): the decode loop
    then never waits for the UI's Python. Its output goes to ``engine.log`` in
    the user state dir. A server profile only talks HTTP and stays here."""
    from engine.hublog import hub_messages_as_progress
    from engine.loading import load_engine

    if profile.backend != "server":
        from engine.child import ProcessBackend
        from engine.paths import state_dir

        return ProcessBackend.start(profile, memory_budget, progress, log=state_dir() / ENGINE_LOG,
                                    threads=engine_threads())
    with hub_messages_as_progress(progress):  # hub retries as progress, not raw text over the screen
        return load_engine(profile, memory_budget=memory_budget, progress=progress)


UI_NICE = 0
"""Nice value the UI's threads take once a local engine is loaded (Linux; 0: unchanged).
``SPECCHAT_UI_NICE=10`` trades keys for speed: measured on 2 cores (app in tmux, 512
tokens, medians of 4), the engine on both cores ran 207 tok/s with the UI at nice 10
against 171 at nice 0 (and 170 at nice 5), but Esc took 0.6-1.8 s to stop a reply instead
of 0.2 s, since every paint queued before the key ran on what the engine left."""


def engine_threads() -> int | None:
    """Torch threads for the app's engine: ``SPECCHAT_THREADS``; else every core but one while
    the UI runs at normal priority (it needs a core while a reply streams: on 2 cores a step
    spread over both waited for the one the UI held), or torch's default (every core) when
    the UI yields (:data:`UI_NICE`). None also on a single core."""
    import os

    if os.environ.get("SPECCHAT_THREADS"):
        return max(1, int(os.environ["SPECCHAT_THREADS"]))
    cores = os.cpu_count() or 1
    return cores - 1 if cores > 1 and ui_nice() == 0 else None


def ui_nice() -> int:
    """:data:`UI_NICE`, or ``SPECCHAT_UI_NICE``."""
    import os

    return int(os.environ.get("SPECCHAT_UI_NICE", UI_NICE))


def needs_room(exc: BaseException) -> bool:
    """True when a load failed for lack of memory (planned, or a real out-of-memory error)."""
    from engine.device import Device
    from engine.errors import MemoryPlanError

    return isinstance(exc, MemoryPlanError) or Device.is_out_of_memory(exc)


def error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, SpecChatError) else f"{type(exc).__name__}: {exc}"


class LoadingMixin:
    """Profile loading and switching. Mixed into :class:`app.ui.app.SpecChatApp`."""

    def switch_profile(self: "SpecChatApp", name: str) -> None:
        """Load profile ``name`` in place of the current pair; the conversation continues.

        A profile that cannot run here (see :mod:`engine.availability`) is refused
        with its reason, and the loaded models stay.
        """
        if self.profiles is None:
            self.notice("No profiles are available.", severity="warning")
            return
        if self.loading:
            self.notice("A profile is still loading; try again when it is ready.", severity="warning")
            return
        try:
            profile = self.profiles.get(name)
        except SpecChatError as exc:
            self.notice(str(exc), severity="error", title="Profile")
            return
        why_not = self.unavailable_profiles().get(profile.name)
        if why_not:
            self.notice(f"{profile.name} cannot run here: {why_not}.", severity="warning", title="Profile unavailable")
            return
        if self.profile is not None and profile.name == self.profile.name and self.backend is not None:
            self.notice(f"{name} is already loaded.")
            return
        self.stop_reply()
        self._start_load(profile)

    def unavailable_profiles(self: "SpecChatApp") -> dict[str, str]:
        """Profile name -> why it cannot run on this machine (CUDA checked once)."""
        if self.profiles is None:
            return {}
        from engine.availability import cuda_present, unavailable_reason

        if self._cuda is None:
            self._cuda = cuda_present()
        reasons = {name: unavailable_reason(self.profiles.get(name), cuda=self._cuda) for name in self.profiles.names()}
        return {name: why for name, why in reasons.items() if why}

    def _start_load(self: "SpecChatApp", profile: "ModelProfile") -> None:
        old, self.backend = self.backend, None
        old_profile = self.profile if old is not None else None
        self.profile = profile
        self.loading = True
        self.sub_title = f"{profile.name} · {profile_pair(profile)}"
        self.hud.set_engine(None, profile)
        self.hud.set_loading(profile.name, f"loading; {old_profile.name} stays until it is ready"
                             if old_profile else "starting", None)
        self.hud.flush()
        self._load_worker(profile, old, old_profile)

    @work(thread=True, group="load", exit_on_error=False)
    def _load_worker(self: "SpecChatApp", profile: "ModelProfile", old: ChatBackend | None,
                     old_profile: "ModelProfile | None" = None) -> None:
        """Load ``profile`` next to the old backend, closing the old one once the new is ready.

        When the new one does not fit next to the old (the memory plan says so,
        or loading runs out of memory), the old one is closed first and the new
        one tried again; if that fails too the old profile is loaded again. Any
        other failure leaves the old backend as it was. Never ends with no model
        unless even reloading the old profile fails (then the notice says so).
        """

        def progress(stage: str, fraction: float | None) -> None:
            self.post_message(LoadProgress(stage, fraction))

        def close(backend: ChatBackend) -> None:
            try:
                backend.close()
            except Exception as exc:  # closing must not block loading the next one
                progress(f"previous models closed with an error: {exc}", None)

        with self._backend_lock:  # taken once any reply on the old backend has stopped
            try:
                backend = self._loader(profile, self._memory_budget, progress)
            except Exception as exc:  # noqa: BLE001 - every failure is reported, none is a traceback
                error = error_text(exc)
                if old is None or old_profile is None:
                    self.post_message(EngineFailed(error, profile.name))
                    return
                if not needs_room(exc):
                    self.post_message(EngineFailed(error, profile.name, (old, old_profile)))
                    return
                progress(f"{profile.name} does not fit next to {old_profile.name}: unloading it first", None)
                close(old)
                try:
                    backend = self._loader(profile, self._memory_budget, progress)
                except Exception as again:  # noqa: BLE001
                    error = error_text(again)
                    progress(f"loading {old_profile.name} again", None)
                    try:
                        restored = self._loader(old_profile, self._memory_budget, progress)
                    except Exception as lost:  # noqa: BLE001
                        self.post_message(EngineFailed(
                            f"{error}. Reloading {old_profile.name} failed too: {error_text(lost)}", profile.name))
                        return
                    self.post_message(EngineFailed(error, profile.name, (restored, old_profile)))
                    return
            else:
                if old is not None:
                    close(old)
        self.post_message(EngineReady(backend, profile))

    def on_load_progress(self: "SpecChatApp", message: LoadProgress) -> None:
        if self.loading and self.screen_stack:
            self.hud.set_loading(None, message.stage, message.fraction)

    def on_engine_ready(self: "SpecChatApp", message: EngineReady) -> None:
        from engine.child import ProcessBackend, lower_priority_except_launcher

        if not self.screen_stack:  # loaded while the app was closing: nobody will use it
            message.backend.close()
            return
        if isinstance(message.backend, ProcessBackend) and ui_nice() > 0:
            lower_priority_except_launcher(ui_nice())  # the engine's threads first (see UI_NICE)
        self.loading = False
        self.backend = message.backend
        self.profile = message.profile
        self.speculation_on = True
        info = message.backend.info
        self.hud.set_speculation(True)
        self.hud.set_notice(None)
        self.hud.set_engine(info, message.profile)
        self.hud.flush()
        self.chat_profile_changed(message.profile.name)
        if self.profiles is not None and message.profile.name in self.profiles.names():
            remember_profile(message.profile.name)  # not a --target/--server pair made on the fly
        summary = plan_lines(info.plan)
        self.notice(f"{message.profile.name} ready" + (f": {summary[0]}" if summary else "."), title="Loaded")
        if info.fallback_reason:
            self.notice(f"Running without the draft model: {info.fallback_reason}", severity="warning",
                        title="Draft refused")
        self.send_queued()

    def on_engine_failed(self: "SpecChatApp", message: EngineFailed) -> None:
        self.loading = False
        if not self.screen_stack:
            return
        title = f"Could not load {message.profile_name or 'profile'}"
        if message.restored is not None:
            backend, profile = message.restored
            self.backend, self.profile = backend, profile
            self.sub_title = f"{profile.name} · {profile_pair(profile)}"
            self.hud.set_engine(backend.info, profile)
            self.hud.flush()
            self.notice(f"{message.error}\nStill using {profile.name}; F2 picks another profile.",
                        severity="error", title=title)
        else:
            self.hud.set_error(message.error)
            self.hud.flush()
            self.notice(f"{message.error}\nNo model is loaded: F2 picks another profile.", severity="error",
                        title=title)
        waiting = self.drop_queued()
        if waiting:
            self.prompt.restore("\n".join(waiting))
