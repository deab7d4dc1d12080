"""The command line: ``repro <command>`` (:func:`repro.cli.main.main`; ``compare``, ``grid`` and the help text in their own modules)."""
