"""The adapters agent_fsm ships, in one table: adding a provider is one entry here.

``agent_fsm.models`` imports its adapter classes lazily from it (``from agent_fsm.models
import GeminiModel`` loads ``google.genai`` only then, and an optional SDK need not be
installed until it is used), and the command line's ``--provider`` chooses from it, with the
provider's key variable and the pip extra that installs its SDK. Nothing here imports an SDK.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_fsm.errors import ConfigError
from agent_fsm.extras import install_hint
from agent_fsm.models.base import Model

__all__ = ["PROVIDERS", "Provider", "model_named"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Provider:
    """One adapter: where it lives and what it needs, imported only when asked for."""

    name: str
    """The provider's name on the command line (``--provider``), e.g. ``"anthropic"``."""
    cls: str
    """The adapter class, as ``agent_fsm.models`` exports it, e.g. ``"AnthropicModel"``."""
    module: str
    """The adapter's module, e.g. ``"agent_fsm.models.anthropic_messages"``."""
    key_variable: str
    """The environment variable the provider's own SDK reads the key from."""
    extra: str | None = None
    """The pip extra that installs its SDK (None: a core dependency)."""
    settings_from_fields: str | None = None
    """A function of the module that turns free-form request fields (a command line's
    ``key=value`` pairs) into the adapter's settings; None: they are settings as they are."""

    def adapter(self) -> Callable[..., Model]:
        """The adapter class, imported now.

        Raises:
            ConfigError: when its SDK is not installed, naming the extra that installs it.
        """
        adapter: Callable[..., Model] = getattr(self._module(), self.cls)
        return adapter

    def settings(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The adapter's settings for free-form request ``fields``.

        Raises:
            ConfigError: for fields the adapter refuses (see ``settings_from_fields``).
        """
        if self.settings_from_fields is None:
            return dict(fields)
        convert: Callable[[Mapping[str, Any]], dict[str, Any]]
        convert = getattr(self._module(), self.settings_from_fields)
        return convert(fields)

    def _module(self) -> Any:
        try:
            return importlib.import_module(self.module)
        except ImportError as err:
            hint = f": {install_hint(self.extra)}" if self.extra else ""
            raise ConfigError(
                f"this provider needs a package that is missing ({err}){hint}"
            ) from None


PROVIDERS: Mapping[str, Provider] = {
    provider.name: provider
    for provider in (
        Provider(
            name="openai",
            cls="OpenAIChatModel",
            module="agent_fsm.models.openai_chat",
            key_variable="OPENAI_API_KEY",
            # fields the SDK does not know go to the server in extra_body
            settings_from_fields="request_settings",
        ),
        Provider(
            name="openai-responses",
            cls="OpenAIResponsesModel",
            module="agent_fsm.models.openai_responses",
            key_variable="OPENAI_API_KEY",
        ),
        Provider(
            name="anthropic",
            cls="AnthropicModel",
            module="agent_fsm.models.anthropic_messages",
            key_variable="ANTHROPIC_API_KEY",
            extra="anthropic",
            # sampling fields an SDK without them cannot send go to the server in extra_body
            settings_from_fields="request_settings",
        ),
        Provider(
            name="gemini",
            cls="GeminiModel",
            module="agent_fsm.models.gemini",
            key_variable="GEMINI_API_KEY",
            extra="gemini",
        ),
    )
}
"""Every adapter agent_fsm ships, by provider name."""


def model_named(name: str) -> Model:
    """The adapter a name such as ``"openai:gpt-4o-mini"`` stands for (``Agent(model=...)``
    takes one): the provider (``PROVIDERS``), a colon, the model, with the key the provider's
    SDK reads from its environment variable.

    Raises:
        ConfigError: a name of another shape or an unknown provider (the message lists the
            known ones), an SDK that is not installed (naming its extra), or no key (the
            adapter checks it when it is built, not at the first call).
    """
    provider_name, colon, model = name.partition(":")
    provider = PROVIDERS.get(provider_name.strip().lower())
    if not colon or provider is None or not model.strip():
        raise ConfigError(
            f"a model given by name is 'provider:model', the provider one of "
            f"{sorted(PROVIDERS)} (e.g. 'openai:gpt-4o-mini'), got {name!r}; or pass a "
            "model object (agent_fsm.models)"
        )
    return provider.adapter()(model.strip())
