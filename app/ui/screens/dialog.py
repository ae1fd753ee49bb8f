"""The base of the app's dialogs: Esc and Enter answer them before the next key is read.

Textual hands each key to the widget focused at the moment the app reads it,
and a dialog's own bindings run later, once the focused widget has passed the
key on (an Input posts ``Submitted``, an OptionList ``OptionSelected``). Keys
typed right after Esc or Enter (a fast typist, or keys that arrive in one read)
were therefore handed to the dialog as it closed: after Esc they were lost, and
after Enter in the rename or export box they were *added to the answer* (a chat
renamed "Notesabc" when "abc" was the start of the next prompt).

Here Esc and Enter are *priority* bindings, which run in the app's own key
handler, in the order the keys were read. Esc dismisses the dialog there and
then: it is off the screen stack before the next key is dispatched, so that key
reaches the prompt box. Enter holds the keys read after it
(:mod:`app.ui.key_hold`) and asks for the answer once the keys typed before
Enter have been handled: through the focused widget's queue and each of its
parents' up to the app's, the path those keys take; the dialog answers, and the
held keys go on to whatever is focused then. Mouse clicks come as the
widgets' messages and end in the same three answers: :meth:`Dialog.picked`
(an option list), :meth:`Dialog.entered` (a one-line input) and
:meth:`Dialog.pressed` (a button).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol, TypeVar, cast

from textual.actions import SkipAction
from textual.binding import Binding
from textual.message import Message
from textual.message_pump import MessagePump
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Button, Input, OptionList
from textual.widgets.option_list import Option

from app.ui.key_hold import KeyHold

ResultType = TypeVar("ResultType")


class HoldsKeys(Protocol):
    """The app a dialog runs in: it holds keys while the dialog answers (app.ui.key_hold)."""

    key_hold: KeyHold


class AskDialog(Message):
    """A dialog asks for another dialog over it; the App opens it (only the App pushes screens)
    and calls ``answered`` with the answer."""

    def __init__(self, dialog: "Dialog[Any]", answered: Callable[[Any], Any]) -> None:
        super().__init__()
        self.dialog = dialog
        self.answered = answered


NARROW_COLUMNS = 60
"""Below this width a dialog's buttons stand one under another (``-narrow``, specchat.tcss): side by
side, the quit question's three ran off a 40-column screen, out of reach."""


class Dialog(ModalScreen[ResultType]):
    """A modal dialog that Esc dismisses with :attr:`CANCELLED` and Enter answers (see the module).

    Subclasses say what an answer means by overriding :meth:`picked`,
    :meth:`entered` or :meth:`pressed`; Enter on any other widget (a multi-line
    text box) goes to that widget."""

    BINDINGS = [
        Binding("escape", "cancel", "Cancel", priority=True),
        Binding("enter", "answer", "Choose", show=False, priority=True),
        Binding("tab", "next_field(1)", "Next field", show=False, priority=True),
        Binding("shift+tab", "next_field(-1)", "Previous field", show=False, priority=True),
    ]
    CANCELLED: ClassVar[object] = None
    """What the dialog returns when cancelled."""

    def __init__(self) -> None:
        super().__init__(classes="dialog-screen")
        self._release_when_ready: list[Callable[[], None]] = []

    def hold_keys_until_ready(self, release: Callable[[], None]) -> None:
        """The app pushes this dialog holding the keys typed after the key that opened it;
        they go on once the dialog's widget has the focus (so F9 then a path types the path).
        Every hold given is released then (one from :meth:`ask`, one from the app's push)."""
        self._release_when_ready.append(release)

    def on_mount(self) -> None:
        for release in self._release_when_ready:  # after the focus the subclass or Textual sets
            self.call_after_refresh(self.app.call_later, release)
        self._fit_lists()
        self.set_class(self.size.width < NARROW_COLUMNS, "-narrow")

    def on_resize(self) -> None:
        self._fit_lists()
        self.set_class(self.size.width < NARROW_COLUMNS, "-narrow")

    def _fit_lists(self) -> None:
        """Keep each option list inside its dialog. The dialog stops at 85% of the screen and a
        list at 24 rows; where the list's rows and the rest would not fit, the dialog cut the
        list's bottom off, and the list scrolled its highlight into the part cut off (F3 at
        80x24: the sixth chat's row highlighted, unseen, and d asked to delete it). A list as
        tall as its rows is measured first; one that runs past its dialog's inside then takes
        just the room left (``1fr``), so it scrolls within what shows."""
        lists = list(self.query(".dialog OptionList").results(OptionList))
        for option_list in lists:
            option_list.styles.height = "auto"
        if lists:
            self.call_after_refresh(self._shrink_cut_lists, lists)

    def _shrink_cut_lists(self, lists: list[OptionList]) -> None:
        for option_list in lists:
            dialog = option_list.parent
            if isinstance(dialog, Widget) and option_list.region.bottom > dialog.content_region.bottom:
                option_list.styles.height = "1fr"

    def ask(self, dialog: "Dialog[Any]", answered: Callable[[Any], Any]) -> None:
        """Open ``dialog`` over this one (through the App); ``answered`` gets its answer. The keys
        typed from now on are the new dialog's: held here, at once, since the App reads the keys
        already typed (r then a new name, in one burst) before this request reaches it."""
        dialog.hold_keys_until_ready(cast(HoldsKeys, self.app).key_hold.hold())
        self.post_message(AskDialog(dialog, answered))

    def action_cancel(self) -> None:
        self.dismiss(self.CANCELLED)  # type: ignore[arg-type]

    def action_answer(self) -> None:
        """Enter: answer for the focused widget once it has taken the keys typed before
        Enter, holding the keys after it meanwhile; on a multi-line text box (or
        nothing to answer) Enter goes to the widget (SkipAction)."""
        focused = self.focused
        if not isinstance(focused, (OptionList, Input, Button)):
            raise SkipAction()
        release = cast(HoldsKeys, self.app).key_hold.hold()
        self._after_queued_keys(focused, lambda: self._answer_for(focused, release))

    def action_next_field(self, step: int) -> None:
        """Tab and shift+Tab: move to the next (previous) field once the focused one has taken the
        keys typed before the Tab, holding the keys after it meanwhile, so that they go to the field
        the Tab moves to. Handed on, the Tab moved the focus only once the keys typed after it had
        been handed to the field it left: F10 then "0.7 Tab 0.5" read a temperature of "0.70.5",
        and "0.8 Tab 0.9 Tab Tab 42" saved a top-p of 0.942 and no seed."""
        focused = self.focused
        release = cast(HoldsKeys, self.app).key_hold.hold()

        def move() -> None:
            try:
                self.focus_next() if step > 0 else self.focus_previous()
            finally:
                release()

        if focused is None:
            move()
        else:
            self._after_queued_keys(focused, move)

    def _after_queued_keys(self, node: MessagePump, then: Callable[[], None]) -> None:
        """``then``, once the keys read before now have gone through ``node`` and up to the
        app, as a key bubbles (an OptionList's Down is a binding the app runs when the key
        gets there): hop by hop through the same queues, behind those keys."""
        if node is self.app:
            node.call_later(then)
        else:
            node.call_later(self._after_queued_keys, node.parent or self.app, then)

    def _answer_for(self, widget: OptionList | Input | Button, release: Callable[[], None]) -> None:
        """Enter's answer, from the widget as it is now (the keys before Enter taken)."""
        try:
            if isinstance(widget, OptionList):
                option = widget.highlighted_option
                if option is not None and not option.disabled:
                    self._answer(lambda: self.picked(option))
            elif isinstance(widget, Input):
                self._answer(lambda: self.entered(widget.value))
            else:
                self._answer(lambda: self.pressed(widget.id))
        finally:
            release()

    def picked(self, option: Option) -> None:
        """An option was chosen (Enter or a click); nothing unless a subclass says."""

    def entered(self, value: str) -> None:
        """Enter in a one-line input; nothing unless a subclass says."""

    def pressed(self, button_id: str | None) -> None:
        """A button was pressed (Enter or a click); nothing unless a subclass says."""

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self._answer(lambda: self.picked(event.option))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._answer(lambda: self.entered(event.value))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self._answer(lambda: self.pressed(event.button.id))

    def _answer(self, answer: Callable[[], None]) -> None:
        if self.is_active:  # not closed, nor answered already
            answer()
