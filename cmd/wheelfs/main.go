// Command wheelfs is the single WheelFS binary: `wheelfs up`, `wheelfs info`,
// `wheelfs status`, `wheelfs bench` and friends.
package main

import (
	"os"

	"github.com/wheelfs/wheelfs/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
