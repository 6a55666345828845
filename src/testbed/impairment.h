// Placeholder: packet loss injection on testbed links (cls_bpf, xagg_loss).
#pragma once
