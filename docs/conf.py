"""Sphinx configuration: partialcoll's documentation site (the guides in
MyST Markdown, the API reference from the docstrings, the benchmark CLI
from its argparse parsers, the environment variables from the one module
that lists them).

Build (partialcoll and its C extension installed, e.g. pip install ".[docs]"):

    sphinx-build -W --keep-going -b html docs docs/_build/html

autodoc imports the installed package, so run ``sphinx-build`` (not
``python -m sphinx`` from the repository root, where the uncompiled
sources would shadow it).
"""
import importlib.util
import inspect
import sys

project = "partialcoll"
author = "partialcoll's authors"
copyright = "partialcoll's authors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon",
              "sphinx.ext.viewcode", "myst_parser", "sphinxarg.ext"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
# headings up to ### get anchors, so pages can link to a section
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

try:                                      # the version and a clear error
    import partialcoll
except ImportError as e:
    sys.exit(f"docs/conf.py: cannot import partialcoll ({e}). Install it "
             f"with its C extension (pip install '.[docs]') and run "
             f"sphinx-build, not python -m sphinx from the source tree.")
release = version = partialcoll.__version__

# The optional frameworks: the API pages of partialcoll.torch and the
# TicTac graphs import torch; without it they are documented against
# autodoc's stand-in objects.  CuPy is only ever imported inside functions.
autodoc_mock_imports = [m for m in ("torch", "torchvision")
                        if importlib.util.find_spec(m) is None]

autodoc_default_options = {"member-order": "bysource"}
autodoc_typehints = "none"          # the docstrings say what is expected
autodoc_preserve_defaults = True    # defaults as written, not their repr
autoclass_content = "both"          # the class and __init__ docstrings
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# Every cross-reference must resolve (sphinx-build -n); only these
# third-party names, which would need network access (intersphinx) to
# link, are exempt.
nitpicky = True
nitpick_ignore_regex = [
    ("py:.*", r"(numpy|np|torch|mpi4py|MPI|cupy)(\..*)?"),
]

html_theme = "furo"
html_title = f"partialcoll {version}"
# MLfabric's docstrings write a batch's size as the paper does, |U|: in
# reStructuredText that is a substitution, defined here as itself.
rst_prolog = r"""
.. |U| replace:: \|U\|
"""

exclude_patterns = ["_build"]
templates_path = []
html_static_path = []


def _init_signature(app, what, name, obj, options, signature, ret):
    """A class with its own ``__new__`` (EagerOptimizer's, which picks the
    wrapped optimizer's class) is shown with its ``__init__``'s arguments,
    not ``__new__``'s forwarding ``(*args, **kwargs)``; without their
    annotations, as everywhere (``autodoc_typehints``)."""
    if what == "class" and "__new__" in vars(obj) and "__init__" in vars(obj):
        sig = inspect.signature(obj.__init__)
        params = [p.replace(annotation=p.empty)             # without self
                  for p in list(sig.parameters.values())[1:]]
        return str(sig.replace(parameters=params,
                               return_annotation=sig.empty)), ret
    return None


def setup(app):
    app.connect("autodoc-process-signature", _init_signature)
