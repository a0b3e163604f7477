"""The writer settings a Spark job must share with the writer: bucket rules, topic/cursor names
and the intake checks, read from the writer's own function config (and --user-config)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from ..bucket.config import BucketConfig
from ..clock import wall_clock_ms
from ..config.function_config import FunctionConfigError, load_function_config, spec_from_config
from ..config.settings import ConfigError, user_config_from_json
from ..scheduler.config import parse_writer_config, scheduling_input
from .backlog import ClassifyOptions
from .errors import SparkJobError


def writer_settings(config_file: Optional[str], user_config: Optional[str],
                    now_ms: Optional[int] = None) -> Tuple[BucketConfig, ClassifyOptions]:
    """(bucket config with the writer's topic and cursor names, intake checks) of the writer
    whose store a job seeds or verifies. Without a config file: the defaults, empty names."""
    cfg: Dict[str, Any] = {}
    if config_file:
        try:
            cfg = load_function_config(config_file)
        except FunctionConfigError as exc:
            raise SparkJobError(str(exc)) from exc
    user = dict(cfg.get("userConfig") or {})
    if user_config:
        try:
            user.update(user_config_from_json(user_config))
        except ConfigError as exc:
            raise SparkJobError(str(exc)) from exc
    topic = cursor = ""
    try:
        if cfg:
            spec = spec_from_config(cfg, {"userConfig": user})
            topic, _ = scheduling_input(spec.inputs, user)
            cursor = spec.fqfn  # what the writer passes as the snapshots' cursor name
        writer = parse_writer_config(user, topic=topic, cursor=cursor)
    except (ValueError, FunctionConfigError) as exc:
        raise SparkJobError(f"writer config: {exc}") from exc
    opts = ClassifyOptions(now_ms=wall_clock_ms() if now_ms is None else now_ms,
                           max_delay_ms=writer.max_delay_seconds * 1000,
                           allowed_target_prefixes=writer.allowed_target_prefixes)
    return writer.bucket, opts
