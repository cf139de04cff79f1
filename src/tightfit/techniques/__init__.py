"""The techniques, behind one interface (techniques/interface.py) and one registry
(techniques/registry.py): each is a folder exposing `draft(model, config) -> Plan` and
`search(problem) -> Front`; the CLI, the API and fit's search dispatch through the registry, so
adding a technique touches its folder and one registry line. `fit` (techniques/fit/) searches
over all of them."""
# Every technique registered before any runs (a technique may ask another by name,
# interface.technique): importing any module of the package imports the registry.
from tightfit.techniques import registry  # noqa: E402,F401
