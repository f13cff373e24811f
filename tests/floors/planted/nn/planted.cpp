// A planted include across one floor (nn and optim sit side by side): the floors check must name it.
#include <kiln/nn/module.hpp>
#include <kiln/optim/optimizer.hpp>
