"""The command line: `pulsar-lifecycle` and its groups, the operator tools and their views.

`main` holds the click groups (each command's implementation is imported when it runs, so
`--help` loads neither pulsar-client nor PySpark); `args` and `client_options` the shared
argument checks and connection flags; `inspect_cli`, `delayed_cli`, `up_cli`, `deletion_cli` the
operator commands, with the `*_view` modules rendering what they read; `demo` the guided demo;
`function_registry` the shipped functions (their config classes and topologies), which the
commands and `docs_reference` (the generated configuration tables) both read.
"""
__all__: list = []
