"""python -m amem_alloc ... is the `amem` command."""
from .cli import main

raise SystemExit(main())
