// Agreed failure: run a step on every rank and make all ranks fail together if any did.
#pragma once
#include <mpi.h>

#include <functional>

namespace shardtrain::runtime {

// Runs fn on every rank of comm. If it throws on any rank, every rank throws the same
// exception type (UserError or Error) with the message of the lowest failing rank, so
// bad input found on one rank ends all of them with one message instead of a hang.
// Collective over comm. The agreement (not fn, which names its own exchanges) is one named
// exchange (runtime/exchange.h): "agree" unless the caller names it ("step.data", "deck.agree"),
// and the watchdog's report prints that name.
void run_agreed(MPI_Comm comm, const std::function<void()>& fn, const char* name = "agree");

}  // namespace shardtrain::runtime
