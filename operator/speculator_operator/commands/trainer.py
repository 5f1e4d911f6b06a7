"""`speculator-operator trainer STAGE`: the stages of a SpeculatorTrainJob as the trainer image runs them, each
handed to its module under pods/ (imported when called: the trainer image holds only the trainer's requirements)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from speculator_operator.pods import trainer

    if args.trainer_command == "fetch":
        return trainer.fetch(args.verifier, args.dest, args.revision, args.data, args.convert, args.convert_revision)
    if args.trainer_command == "run":
        held_out = (args.hold_out, args.held_out_file) if args.hold_out else None
        return trainer.run(args.stage, args.tool[1:] if args.tool[:1] == ["--"] else args.tool, held_out)
    if args.trainer_command == "evaluate":
        from speculator_operator.pods import evaluate as evaluation

        return evaluation.main(args)
    if args.trainer_command == "sweep":
        from speculator_operator.pods import sweep

        return sweep.main(args)
    if args.trainer_command == "audit":
        return trainer.audit_checkpoint(args.checkpoints, args.verifier, args.release)
    return trainer.publish(
        args.checkpoints,
        args.target,
        args.verifier,
        args.verifier_revision,
        args.job,
        args.release,
        verifier_content=args.verifier_content,
        uri=args.uri,
        evaluation=args.evaluation,
        sweep=args.sweep,
    )
