"""``python -m lit_fgrpo`` is the ``lit-fgrpo`` command."""

from lit_fgrpo.cli import main

raise SystemExit(main())
