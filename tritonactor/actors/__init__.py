"""The actor runtime: actors with bounded mailboxes, tell/ask, and supervision by their owner."""

from tritonactor.actors.actor import Actor, ActorRef, ActorStopped, ActorSystem, ChildFailed
from tritonactor.actors.reply import Reply

__all__ = ["Actor", "ActorRef", "ActorStopped", "ActorSystem", "ChildFailed", "Reply"]
