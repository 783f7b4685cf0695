"""The config engine's internals (torch-free); users import :mod:`lazylab.configs` instead,
and tools :mod:`lazylab.configs.inspect` (the public view of a config).

One job per module, in dependency order:

    errors        the user-error classes (each a lazylab.errors.LazylabError and the built-in exception labml
                  raises) and name suggestions
    typing_tools  predicates on annotations (Union? takes any string? plain data? a config class?): a leaf
    coerce        text / YAML values -> values of an item's declared type
    constraints   ``Annotated[T, Ge(1), ...]``: an item's type T and the checks on its values
    declarations  what a class declares: items, options, aggregates, flags; merged along the MRO into a Spec
    registration  ``option``, ``calculate``, ``aggregate``, ``hyperparams``, ``meta_config``
    state         one config object's given and computed values, and their provenance; the computations in
                  progress (``ACTIVE``)
    resolver      computing an item lazily, once, in labml's order of precedence
    overrides     giving values before they are computed: ``_set_values``, assignment, ``set_default``,
                  ``parse_overrides`` / ``apply_overrides``
    base          ``BaseConfigs``: Python's attribute protocol wired to the resolver and overrides
    report        labml's ``_to_json`` and per-item provenance (``explain``)
    yaml_io       ``to_dict`` / ``dump`` / ``load``
    comments      items' help text, read from the class source
    listing       ``describe`` / ``format_description``, for ``lazylab options`` and ``--help``
"""
