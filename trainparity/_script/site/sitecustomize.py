"""Installed before a script's first line by `tp.check_resume_script` (this directory leads PYTHONPATH).

Does nothing unless the check's environment variable is set; it is removed at once, so that
the script's own Python subprocesses are not observed.
"""

import os

if os.environ.get("TRAINPARITY_SCRIPT"):
    from trainparity._script._hook import install_from_environment

    install_from_environment()
