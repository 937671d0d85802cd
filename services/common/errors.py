"""Domain errors that carry their gRPC status code.

Handlers raise these; the shared server interceptor (`interceptor.instrument`) turns them into the
status code in one place, so servicers stay free of transport details and can be tested without a server.
"""

from __future__ import annotations

import grpc


class RequestError(Exception):
    """An error that the client caused or must react to, with the gRPC code it maps to."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(RequestError):
    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem

    def within(self, parent: str) -> InvalidArgument:
        """The same problem with its field named inside `parent`: `long_term` within `requests[2]` is
        `requests[2].long_term`."""
        return InvalidArgument(f"{parent}.{self.field}", self.problem)


class ResourceExhausted(RequestError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(RequestError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unavailable(RequestError):
    code = grpc.StatusCode.UNAVAILABLE
