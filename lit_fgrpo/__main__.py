"""``python -m lit_fgrpo`` is the ``lit-fgrpo`` command."""

from lit_fgrpo.commands.cli import main

raise SystemExit(main())
