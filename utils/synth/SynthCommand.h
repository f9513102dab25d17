//===- SynthCommand.h - `kiln-gguf synth` -----------------------*- C++ -*-===//
#ifndef KILN_SYNTH_SYNTHCOMMAND_H
#define KILN_SYNTH_SYNTHCOMMAND_H

namespace kiln::synth {

/// Runs `kiln-gguf synth` with the arguments after "synth"; returns the exit
/// status (0 ok, 1 failure, 2 bad usage).
int runSynthCommand(int argc, char **argv);

} // namespace kiln::synth

#endif // KILN_SYNTH_SYNTHCOMMAND_H
