"""The workflows defined in this process, by name, and the lookup of a step row's code.

A worker finds a step's function by importing the handler path stored on
the step row (which imports the module defining the workflow, registering
it) and looking the step up here. Only functions registered as steps ever
run. Kept apart from the ``Workflow`` class so that the code running a
step can look workflows up without importing the definition API, whose
``start()`` in turn reaches the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.module_loading import import_string

from .exceptions import UnknownWorkflow, WorkflowDefinitionError

if TYPE_CHECKING:
    from .definition import StepDef, Workflow

_REGISTRY: dict[str, Workflow] = {}


def register(workflow: Workflow) -> None:
    """Register ``workflow`` under its name; a name taken by another module is an error.

    A re-import of the module that defined it replaces it.
    """
    existing = _REGISTRY.get(workflow.name)
    if existing is not None and existing.module != workflow.module:
        raise WorkflowDefinitionError(
            f"a workflow named {workflow.name!r} is already defined in {existing.module}; "
            "workflow names must be unique across the project."
        )
    _REGISTRY[workflow.name] = workflow


def registered() -> list[Workflow]:
    """Every workflow defined so far in this process (its module imported)."""
    return list(_REGISTRY.values())


def get_workflow(name: str) -> Workflow:
    """The workflow registered under ``name`` (its module must have been imported)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownWorkflow(
            f"no workflow named {name!r} is defined (is the module that defines it imported?)."
        ) from None


def resolve_step(workflow_name: str, step_name: str, handler_path: str) -> StepDef:
    """The step to run for a step row, with its *current* code.

    Importing the stored handler path imports the module defining the
    workflow (registering it). The function there must be a registered
    step: a row written by someone else cannot make a worker call an
    arbitrary function. The step is then looked up by workflow and step name,
    so a step whose function was replaced in a deploy runs the new code.
    """
    try:
        func = import_string(handler_path)
    except ImportError as e:
        raise UnknownWorkflow(
            f"step {step_name!r} of workflow {workflow_name!r}: {handler_path!r} cannot be "
            f"imported ({e}). If it moved, keep an alias at the old path until its runs finish."
        ) from e
    if not any(s.func is func for wf in _REGISTRY.values() for s in wf.steps):
        raise UnknownWorkflow(
            f"{handler_path!r} is not a registered workflow step; only functions decorated "
            "with @workflow.step() run."
        )
    return get_workflow(workflow_name).get_step(step_name)
