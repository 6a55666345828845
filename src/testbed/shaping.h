// Placeholder: per-link bandwidth shaping in the testbed (tbf/htb).
#pragma once
