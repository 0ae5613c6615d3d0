"""The HTTP API's error reply, shared by the server and its routers."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


class ApiError(Exception):
    """An HTTP error reply ``{"error": message, "field": field?}`` (plus ``extra`` keys)."""

    def __init__(self, status: int, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any):
        super().__init__(message)
        self.status, self.message, self.field = status, message, field
        self.headers, self.extra = headers, extra

    def response(self) -> JSONResponse:
        body: dict[str, Any] = {"error": self.message, **self.extra}
        if self.field is not None:
            body["field"] = self.field
        return JSONResponse(body, status_code=self.status, headers=self.headers)
