// Temporary: commands not yet implemented.
#include "cli/commands.h"
#include "core/error.h"
namespace rt::cli {
int cmd_loss(const Args&) { fail("[loss] not implemented yet"); }
int cmd_train(const Args&) { fail("[train] not implemented yet"); }
int cmd_sample(const Args&) { fail("[sample] not implemented yet"); }
}  // namespace rt::cli
