"""The names the configuration gives models and routes (and pipelines, which take routes' names)."""

from __future__ import annotations

from typing import Annotated

import msgspec

ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:/-]+$")]
# A route's name is one path segment of `/admin/routes/{name}`: a model's name without slashes.
RouteName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]
