"""Events: publish / subscribe / ack (the public face; the commands are ``services.events``).

from django_dispatch import events
events.publish(name, payload=None, *, key=None) -> event_id   # in the caller's transaction
events.subscribe(name, *, timeout, key=None) -> Event | None  # one subscriber at a time
events.ack(event_id) -> bool                                  # compare-and-set
"""

from .services.events import (  # noqa: F401 (not in __all__: hooks)
    Event,
    ack,
    asubscribe,
    check_key,
    check_name,
    check_timeout,
    on_publish,
    publish,
    subscribe,
)

__all__ = ["Event", "ack", "asubscribe", "check_key", "check_name", "publish", "subscribe"]
